//! The `control` target's checks: the lines of a session's control protocol on its
//! out-of-band connection, `ferroce::session::parse_hello` (the hello,
//! `ferroce-session/1 role=<role> mtu=<bytes>`) and `ferroce::session::ChannelDesc::parse_line`
//! (the channel description, `channel slots=<n> request=<bytes> reply=<bytes>`).
//!
//! [`check_control`] reads the input as text (lossy UTF-8) and feeds every line, as
//! `read_line` hands it over (no `\n`, at most 256 bytes), to both parsers: a hello that parses
//! is written again with `hello_line` and parses to the same role and MTU; one refused for its
//! version names a version other than ours; a channel line that parses is written again with
//! `to_line` and parses to the same description. Both written lines are one line of at most
//! 256 bytes. Then the first 11 bytes of the input, taken as a role, an MTU and a channel
//! description, are written with `hello_line` and `to_line` and must parse back to exactly
//! those values.

use ferroce::session::{hello_line, parse_hello, ChannelDesc, Role, SessionError, SESSION_VERSION};

/// The longest line the out-of-band connection carries (`oob::MAX_LINE`).
pub const MAX_LINE: usize = 256;
/// At most this many lines of an input are parsed.
const MAX_LINES: usize = 64;

fn check_written(line: &str) {
    assert!(
        !line.contains('\n'),
        "a written line holds a newline: {line:?}"
    );
    assert!(
        line.len() <= MAX_LINE,
        "a {}-byte line: {line:?}",
        line.len()
    );
}

fn check_hello(line: &str) {
    match parse_hello(line) {
        Ok((role, mtu)) => {
            let again = hello_line(role, mtu);
            check_written(&again);
            match parse_hello(&again) {
                Ok(back) => assert_eq!(back, (role, mtu), "{line:?} → {again:?}"),
                Err(e) => panic!("{again:?}, written from {line:?}, does not parse: {e}"),
            }
        }
        Err(SessionError::Version { ours, theirs }) => {
            assert_eq!(ours, SESSION_VERSION);
            assert_ne!(theirs, SESSION_VERSION, "refused our own version: {line:?}");
        }
        Err(SessionError::Protocol(_)) => {}
        Err(e) => panic!("an unexpected error for hello {line:?}: {e}"),
    }
}

fn check_channel(line: &str) {
    match ChannelDesc::parse_line(line) {
        Ok(desc) => {
            let again = desc.to_line();
            check_written(&again);
            match ChannelDesc::parse_line(&again) {
                Ok(back) => assert_eq!(back, desc, "{line:?} → {again:?}"),
                Err(e) => panic!("{again:?}, written from {line:?}, does not parse: {e}"),
            }
        }
        Err(SessionError::Protocol(_)) => {}
        Err(e) => panic!("an unexpected error for channel line {line:?}: {e}"),
    }
}

/// Runs the `control` target's checks on one input.
pub fn check_control(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for line in text.split('\n').take(MAX_LINES) {
        // `read_line` refuses longer lines before anything parses them.
        if line.len() > MAX_LINE {
            continue;
        }
        check_hello(line);
        check_channel(line);
    }

    // Emit → parse from values the input picks.
    if data.len() >= 11 {
        let role = if data[0] & 1 == 0 {
            Role::Controller
        } else {
            Role::Coprocessor
        };
        let mtu = u32::from_le_bytes([data[1], data[2], data[3], data[4]]);
        let line = hello_line(role, mtu);
        check_written(&line);
        assert_eq!(parse_hello(&line).ok(), Some((role, mtu)), "{line:?}");
        let desc = ChannelDesc::new(
            u16::from_le_bytes([data[5], data[6]]),
            u32::from_le_bytes([data[7], data[8], 0, 0]) << (data[9] & 15),
            u32::from(data[10]) << (data[9] >> 4),
        );
        let line = desc.to_line();
        check_written(&line);
        assert_eq!(ChannelDesc::parse_line(&line).ok(), Some(desc), "{line:?}");
    }
}
