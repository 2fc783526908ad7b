//! Percent-encoding of `grpc-message` (gRPC over HTTP/2 spec, `doc/PROTOCOL-HTTP2.md`): the
//! message is UTF-8; bytes outside `0x20..=0x7E`, and `%` itself, are sent as `%XX`.

/// Encodes a status message for the `grpc-message` header.
pub fn encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7E).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0xF));
        }
    }
    out
}

/// Decodes a `grpc-message` value. As the spec asks of receivers, a `%` not followed by two
/// hex digits is kept as it is, and bytes that are not UTF-8 become U+FFFD.
pub fn decode(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        if value[i] == b'%'
            && let (Some(h), Some(l)) = (
                value.get(i + 1).and_then(hex_value),
                value.get(i + 2).and_then(hex_value),
            )
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(value[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_digit(v: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(v & 0xF)])
}

fn hex_value(c: &u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_percent_controls_and_non_ascii() {
        assert_eq!(encode("plain text: ok!"), "plain text: ok!");
        assert_eq!(encode("100%"), "100%25");
        assert_eq!(encode("a\nb\tc"), "a%0Ab%09c");
        assert_eq!(encode("héllo ✓"), "h%C3%A9llo %E2%9C%93");
        assert_eq!(encode("\x7f~"), "%7F~");
    }

    #[test]
    fn decodes_and_tolerates_broken_escapes() {
        assert_eq!(decode(b"h%C3%A9llo %e2%9c%93"), "héllo ✓");
        assert_eq!(decode(b"50%"), "50%");
        assert_eq!(decode(b"%zz%4"), "%zz%4");
        assert_eq!(decode(b"%FF"), "\u{FFFD}");
    }

    #[test]
    fn round_trips() {
        for s in [
            "",
            "x",
            "deadline exceeded: 50 ms",
            "💥 %20 \r\n\0 end",
            "ümlaut",
        ] {
            assert_eq!(decode(encode(s).as_bytes()), s);
        }
    }
}
