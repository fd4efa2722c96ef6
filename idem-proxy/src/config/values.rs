//! Single values as written: durations, addresses, byte sizes and counts, each within
//! what works.

use std::net::SocketAddr;
use std::time::Duration;

use toml::Spanned;

use super::ConfigError;
use super::file::Locator;

/// A duration as people write it (`30s`, `24h`, `1h 30m`), at least `min`.
pub(super) fn duration(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<String>>,
    default: Duration,
    min: Duration,
) -> Result<Duration, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    let parsed = humantime::parse_duration(value.get_ref()).map_err(|err| {
        at.error(
            value.span(),
            format!("`{name}`: {err}; write a duration such as \"30s\", \"5m\" or \"24h\""),
        )
    })?;
    if parsed > idem_core::raw::MAX_DURATION {
        return Err(at.error(
            value.span(),
            format!("`{name}` is longer than idem allows (100 years)"),
        ));
    }
    if parsed < min {
        return Err(at.error(
            value.span(),
            format!(
                "`{name}` is {}, under the least that works, {}",
                humantime::format_duration(parsed),
                humantime::format_duration(min)
            ),
        ));
    }
    Ok(parsed)
}

pub(super) fn address(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<String>>,
    default: &str,
) -> Result<SocketAddr, ConfigError> {
    let Some(value) = value else {
        return Ok(default.parse().expect("the defaults are addresses"));
    };
    value.get_ref().parse().map_err(|_| {
        at.error(
            value.span(),
            format!(
                "`{name}` = {:?} is not an address and port: write \"127.0.0.1:8080\" (a host name is not resolved here)",
                value.get_ref()
            ),
        )
    })
}

pub(super) fn bytes(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<i64>>,
    default: usize,
) -> Result<usize, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    // At most 1 GiB: a body is held in memory whole to fingerprint or store it.
    usize::try_from(*value.get_ref())
        .ok()
        .filter(|bytes| (1..=1 << 30).contains(bytes))
        .ok_or_else(|| {
            at.error(
                value.span(),
                format!(
                    "`{name}` is a number of bytes from 1 to 1073741824 (1 GiB), such as 1048576"
                ),
            )
        })
}

/// A count from 1 to `most`.
pub(super) fn count(
    at: &Locator<'_>,
    name: &str,
    value: Option<&Spanned<i64>>,
    default: usize,
    most: usize,
) -> Result<usize, ConfigError> {
    let Some(value) = value else {
        return Ok(default);
    };
    usize::try_from(*value.get_ref())
        .ok()
        .filter(|n| (1..=most).contains(n))
        .ok_or_else(|| {
            at.error(
                value.span(),
                format!("`{name}` is a number from 1 to {most}"),
            )
        })
}
