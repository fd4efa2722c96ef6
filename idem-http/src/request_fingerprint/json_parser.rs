//! JSON bodies read as serde_json reads them, each number kept as its text.

use std::borrow::Cow;

/// A JSON value as the fingerprint reads it: a number keeps its text, since serde_json
/// (without `arbitrary_precision`, which would change every crate's `Value`) parses
/// numbers beyond 64 bits and beyond an f64's precision to an f64, so two amounts could
/// be one.
#[derive(Debug)]
pub(super) enum Json<'a> {
    Null,
    Bool(bool),
    Number(&'a str),
    /// Borrowed from the body unless it has escapes.
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    /// Sorted by name as `idem_core::Fingerprint::of_json` sorts, each name once: a
    /// repeated name keeps its last value, as serde_json does. A sorted list, where a map
    /// would allocate a node of more than a kilobyte for the few members of a request.
    Object(Members<'a>),
}

/// An object's members, sorted by name, each name once.
#[derive(Debug)]
pub(super) struct Members<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

impl<'a> Members<'a> {
    /// The members as they came: sorted, and a repeated name's last value kept.
    fn from_read(mut members: Vec<(Cow<'a, str>, Json<'a>)>) -> Self {
        if !members.windows(2).all(|pair| pair[0].0 < pair[1].0) {
            // Stable: a repeated name's values stay in the order they came.
            members.sort_by(|a, b| a.0.cmp(&b.0));
            members.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                if same {
                    std::mem::swap(&mut later.1, &mut kept.1);
                }
                same
            });
        }
        Self(members)
    }

    /// The members in name order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(Cow<'a, str>, Json<'a>)> {
        self.0.iter()
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.0
            .binary_search_by(|(member, _)| member.as_ref().cmp(name))
            .ok()
    }

    /// The value of `name`, to change.
    pub(super) fn get_mut(&mut self, name: &str) -> Option<&mut Json<'a>> {
        let at = self.position(name)?;
        self.0.get_mut(at).map(|(_, value)| value)
    }

    /// Removes `name` and its value, if present.
    pub(super) fn remove(&mut self, name: &str) {
        if let Some(at) = self.position(name) {
            self.0.remove(at);
        }
    }
}

/// Containers nested deeper than this are refused, as serde_json refuses them (its
/// recursion limit of 128 admits 127 levels), which bounds the recursion here too.
const MAX_DEPTH: usize = 127;

/// One pass over the body (linear in its length, whatever its depth) accepting what
/// serde_json accepts, except numbers out of an f64's range, which serde_json refuses and
/// this keeps as text.
pub(super) struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    pub(super) fn parse(body: &'a [u8]) -> Option<Json<'a>> {
        // serde_json refuses a body that is not UTF-8 all through: outside strings only
        // ASCII is valid, and strings are checked.
        let text = std::str::from_utf8(body).ok()?;
        let mut parser = Parser { text, at: 0 };
        let value = parser.value(MAX_DEPTH)?;
        parser.skip_whitespace();
        (parser.at == text.len()).then_some(value)
    }

    fn rest(&self) -> &'a [u8] {
        self.text.as_bytes().get(self.at..).unwrap_or_default()
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.at += 1;
        }
        found
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &str, value: Json<'a>) -> Option<Json<'a>> {
        let found = self.rest().starts_with(word.as_bytes());
        self.at += word.len();
        found.then_some(value)
    }

    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        self.skip_whitespace();
        match self.peek()? {
            b'n' => self.literal("null", Json::Null),
            b't' => self.literal("true", Json::Bool(true)),
            b'f' => self.literal("false", Json::Bool(false)),
            b'"' => self.string().map(Json::String),
            b'-' | b'0'..=b'9' => self.number().map(Json::Number),
            b'[' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mut items = Vec::new();
                self.skip_whitespace();
                if self.eat(b']') {
                    return Some(Json::Array(items));
                }
                loop {
                    items.push(self.value(depth)?);
                    self.skip_whitespace();
                    if self.eat(b']') {
                        return Some(Json::Array(items));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            b'{' => {
                let depth = depth.checked_sub(1)?;
                self.at += 1;
                let mut members = Vec::new();
                self.skip_whitespace();
                if self.eat(b'}') {
                    return Some(Json::Object(Members::from_read(members)));
                }
                loop {
                    self.skip_whitespace();
                    if self.peek() != Some(b'"') {
                        return None;
                    }
                    let name = self.string()?;
                    self.skip_whitespace();
                    if !self.eat(b':') {
                        return None;
                    }
                    members.push((name, self.value(depth)?));
                    self.skip_whitespace();
                    if self.eat(b'}') {
                        return Some(Json::Object(Members::from_read(members)));
                    }
                    if !self.eat(b',') {
                        return None;
                    }
                }
            }
            _ => None,
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, as its text.
    fn number(&mut self) -> Option<&'a str> {
        let start = self.at;
        self.eat(b'-');
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.eat(b'.') && !self.digits() {
            return None;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !self.digits() {
                return None;
            }
        }
        self.text.get(start..self.at)
    }

    /// Skips digits; whether there was one.
    fn digits(&mut self) -> bool {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at > start
    }

    /// A string, its escapes decoded; a lone surrogate is refused, as serde_json does.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let start = self.at;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.at += 1;
            }
            // `at` stops on an ASCII byte or the end, a character boundary.
            let run = self.text.get(start..self.at)?;
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    // Most strings have no escape: the body's own text, no copy.
                    if out.is_empty() {
                        return Some(Cow::Borrowed(run));
                    }
                    out.push_str(run);
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    out.push_str(run);
                    self.at += 1;
                    let escape = self.peek()?;
                    self.at += 1;
                    out.push(match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    });
                }
                // A control character.
                _ => return None,
            }
        }
    }

    /// After `\u`: one code point, or a surrogate pair `\uD83D\uDE00`.
    fn unicode_escape(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xD800..0xDC00).contains(&high) {
            // A low surrogate alone is no `char`.
            return char::from_u32(high);
        }
        if !self.rest().starts_with(b"\\u") {
            return None;
        }
        self.at += 2;
        let low = self.hex4()?;
        if !(0xDC00..0xE000).contains(&low) {
            return None;
        }
        char::from_u32(0x1_0000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.as_bytes().get(self.at..self.at + 4)?;
        self.at += 4;
        digits.iter().try_fold(0, |n, &b| {
            let digit = char::from(b).to_digit(16)?;
            Some(n * 16 + digit)
        })
    }
}
