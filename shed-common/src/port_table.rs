// SPDX-License-Identifier: MIT OR Apache-2.0
//! `SHED_PORT_SLOTS`: each TCP port's slot, packed a byte a port, eight
//! ports to a word. An array map's element takes at least 8 bytes, so a word
//! per port cost 512 KiB in every gate, most of a pod's maps; packed, 64 KiB.
//! Byte 0 of a port means unprotected, else slot + 1 (slots are below
//! [`crate::capacity::MAX_PORTS`], so they fit).

// Every slot + 1 fits its byte.
const _: () = assert!(crate::capacity::MAX_PORTS < 256);

/// Ports per word.
pub const PORTS_PER_WORD: u32 = 8;
/// Words in the table: one per eight port numbers.
pub const WORDS: u32 = crate::capacity::PORT_NUMBERS / PORTS_PER_WORD;

/// The word holding `port`'s byte.
#[inline(always)]
pub const fn word_of(port: u16) -> u32 {
    port as u32 / PORTS_PER_WORD
}

const fn shift_of(port: u16) -> u32 {
    (port as u32 % PORTS_PER_WORD) * 8
}

/// `port`'s byte of its `word`: 0 unprotected, else slot + 1.
#[inline(always)]
pub const fn slot_plus_one(word: u64, port: u16) -> u32 {
    ((word >> shift_of(port)) & 0xff) as u32
}

/// `word` with `port`'s byte set to `slot_plus_one` (0: unprotected); the
/// other seven ports' bytes kept.
pub const fn with_slot(word: u64, port: u16, slot_plus_one: u8) -> u64 {
    (word & !(0xff << shift_of(port))) | ((slot_plus_one as u64) << shift_of(port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_port_has_its_own_byte_and_writing_one_keeps_the_others() {
        assert_eq!(WORDS, 8192);
        let mut word = 0;
        for (i, port) in (8080u16..8088).enumerate() {
            assert_eq!(word_of(port), 1010);
            word = with_slot(word, port, i as u8 + 1);
        }
        assert_eq!(word, 0x0807_0605_0403_0201);
        for (i, port) in (8080u16..8088).enumerate() {
            assert_eq!(slot_plus_one(word, port), i as u32 + 1, "{port}");
        }
        let cleared = with_slot(word, 8083, 0);
        assert_eq!(cleared, 0x0807_0605_0003_0201);
        assert_eq!(slot_plus_one(cleared, 8083), 0);
        assert_eq!(with_slot(cleared, 8083, 64), 0x0807_0605_4003_0201, "the largest slot + 1 fits");
        assert_eq!((word_of(0), word_of(7), word_of(8), word_of(u16::MAX)), (0, 0, 1, WORDS - 1));
        assert_eq!(slot_plus_one(with_slot(0, u16::MAX, 0xff), u16::MAX), 0xff);
        assert_eq!(with_slot(0, u16::MAX, 0xff), 0xff00_0000_0000_0000, "the top port is the top byte");
    }
}
