//! Generated JSON for the property tests: trees of values with numbers of many digits,
//! written out in many layouts.

use proptest::prelude::*;

/// A JSON number's parts, written as one token.
#[derive(Clone, Debug)]
pub(super) struct Number {
    negative: bool,
    whole: String,
    fraction: Option<String>,
    exponent: Option<String>,
}

impl Number {
    fn text(&self) -> String {
        let mut text = String::new();
        if self.negative {
            text.push('-');
        }
        text.push_str(&self.whole);
        if let Some(fraction) = &self.fraction {
            text.push('.');
            text.push_str(fraction);
        }
        if let Some(exponent) = &self.exponent {
            text.push_str(exponent);
        }
        text
    }

    /// Changes one digit of the significand, so the value changes.
    pub(super) fn change_a_digit(&mut self, choice: usize) {
        let fraction_len = self.fraction.as_ref().map_or(0, String::len);
        let at = choice % (self.whole.len() + fraction_len);
        let (digits, at, leading) = if at < self.whole.len() {
            let leading = at == 0 && self.whole.len() > 1;
            (&mut self.whole, at, leading)
        } else {
            (
                self.fraction.as_mut().unwrap(),
                at - self.whole.len(),
                false,
            )
        };
        let old = digits.as_bytes()[at] - b'0';
        let mut new = (old + 1 + (choice / 7 % 9) as u8) % 10;
        if leading && new == 0 {
            new = if old == 1 { 2 } else { 1 };
        }
        digits.replace_range(at..=at, &new.to_string());
    }
}

#[derive(Clone, Debug)]
pub(super) enum Tree {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Tree>),
    Object(Vec<(String, Tree)>),
}

/// A tiny generator driving the layout choices.
pub(super) struct Layout(u64);

impl Layout {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % below as u64) as usize
    }

    fn space(&mut self, out: &mut String) {
        for _ in 0..self.next(3) {
            out.push([' ', '\t', '\n', '\r'][self.next(4)]);
        }
    }

    fn string(&mut self, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            let must = c == '"' || c == '\\' || c < ' ';
            if !must && self.next(3) > 0 {
                out.push(c);
                continue;
            }
            match (c, self.next(2)) {
                ('"', 0) => out.push_str("\\\""),
                ('\\', 0) => out.push_str("\\\\"),
                ('\n', 0) => out.push_str("\\n"),
                ('/', 0) => out.push_str("\\/"),
                _ => {
                    let mut units = [0; 2];
                    for unit in c.encode_utf16(&mut units) {
                        if self.next(2) == 0 {
                            out.push_str(&format!("\\u{unit:04x}"));
                        } else {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                }
            }
        }
        out.push('"');
    }

    fn write(&mut self, tree: &Tree, out: &mut String) {
        self.space(out);
        match tree {
            Tree::Null => out.push_str("null"),
            Tree::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Tree::Number(number) => out.push_str(&number.text()),
            Tree::String(text) => self.string(text, out),
            Tree::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.write(item, out);
                }
                self.space(out);
                out.push(']');
            }
            Tree::Object(members) => {
                let mut order: Vec<usize> = (0..members.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, self.next(i + 1));
                }
                out.push('{');
                for (i, &at) in order.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.space(out);
                    self.string(&members[at].0, out);
                    self.space(out);
                    out.push(':');
                    self.write(&members[at].1, out);
                }
                self.space(out);
                out.push('}');
            }
        }
        self.space(out);
    }

    pub(super) fn render(seed: u64, tree: &Tree) -> String {
        let mut out = String::new();
        Layout(seed).write(tree, &mut out);
        out
    }
}

pub(super) fn numbers_of(tree: &mut Tree) -> Vec<&mut Number> {
    match tree {
        Tree::Number(number) => vec![number],
        Tree::Array(items) => items.iter_mut().flat_map(numbers_of).collect(),
        Tree::Object(members) => members
            .iter_mut()
            .flat_map(|(_, item)| numbers_of(item))
            .collect(),
        _ => Vec::new(),
    }
}

fn number() -> impl Strategy<Value = Number> {
    (
        any::<bool>(),
        prop_oneof![Just("0".to_string()), "[1-9][0-9]{0,25}"],
        proptest::option::of("[0-9]{1,25}"),
        proptest::option::of("[eE][+-]?[0-9]{1,3}"),
    )
        .prop_map(|(negative, whole, fraction, exponent)| Number {
            negative,
            whole,
            fraction,
            exponent,
        })
}

pub(super) fn tree() -> impl Strategy<Value = Tree> {
    let text = "[a-c\"\\\\/\n\u{1}é😀]{0,4}";
    let leaf = prop_oneof![
        Just(Tree::Null),
        any::<bool>().prop_map(Tree::Bool),
        number().prop_map(Tree::Number),
        text.prop_map(Tree::String),
    ];
    leaf.prop_recursive(4, 32, 5, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Tree::Array),
            proptest::collection::btree_map(text, inner, 0..5)
                .prop_map(|members| Tree::Object(members.into_iter().collect())),
        ]
    })
}

pub(super) fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map("[a-d/~0-1]{0,3}", inner, 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}
