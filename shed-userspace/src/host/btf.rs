// SPDX-License-Identifier: MIT OR Apache-2.0
//! Just enough of the kernel's BTF to find a struct member's byte offset, so
//! the socket tracepoints can read a socket's network namespace on the
//! running kernel without compiled-in struct layouts (aya-obj keeps its BTF
//! members private).
use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;

struct Member {
    name: u32,
    type_id: u32,
    bit_offset: u32,
}

#[expect(clippy::struct_field_names, reason = "BTF's own name for the field (size, or the type referred to)")]
struct Type {
    kind: u32,
    name: u32,
    /// size, or the referenced type for modifiers and typedefs
    size_or_type: u32,
    members: Vec<Member>,
}

pub(crate) struct Btf {
    types: Vec<Type>, // index = type id - 1
    strings: Vec<u8>,
    by_name: HashMap<String, Vec<u32>>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

impl Btf {
    pub(crate) fn from_sys_fs() -> Option<Self> {
        Self::parse(&std::fs::read("/sys/kernel/btf/vmlinux").ok()?)
    }

    pub(crate) fn parse(data: &[u8]) -> Option<Self> {
        if u16::from_le_bytes(data.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
            return None;
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let types_bytes = data.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = data.get(hdr_len + str_off..hdr_len + str_off + str_len)?.to_vec();
        let mut types = Vec::new();
        let mut at = 0;
        while at + 12 <= types_bytes.len() {
            let name = u32_at(types_bytes, at)?;
            let info = u32_at(types_bytes, at + 4)?;
            let size_or_type = u32_at(types_bytes, at + 8)?;
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31;
            let mut members = Vec::new();
            at += match kind {
                1 | 14 | 17 => 4,     // int, var, decl tag
                3 => 12,              // array
                6 | 13 => 8 * vlen,   // enum, func proto
                15 | 19 => 12 * vlen, // datasec, enum64
                KIND_STRUCT | KIND_UNION => {
                    for m in 0..vlen {
                        let base = at + 12 * m;
                        let offset = u32_at(types_bytes, base + 8)?;
                        members.push(Member {
                            name: u32_at(types_bytes, base)?,
                            type_id: u32_at(types_bytes, base + 4)?,
                            bit_offset: if kind_flag != 0 { offset & 0x00ff_ffff } else { offset },
                        });
                    }
                    12 * vlen
                }
                _ => 0,
            };
            types.push(Type { kind, name, size_or_type, members });
        }
        let mut btf = Self { types, strings, by_name: HashMap::new() };
        for (i, t) in btf.types.iter().enumerate() {
            if matches!(t.kind, KIND_STRUCT | KIND_UNION) && t.name != 0 {
                let name = btf.string(t.name).to_owned();
                btf.by_name.entry(name).or_default().push(i as u32 + 1);
            }
        }
        Some(btf)
    }

    fn string(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    /// Follows typedefs and qualifiers to the underlying type id.
    fn resolve(&self, mut id: u32) -> u32 {
        while let Some(t) = self.get(id) {
            if matches!(t.kind, KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG) {
                id = t.size_or_type;
            } else {
                break;
            }
        }
        id
    }

    /// Bit offset and type of member `name` in struct/union `id`, looking into anonymous members.
    fn member(&self, id: u32, name: &str) -> Option<(u32, u32)> {
        let t = self.get(self.resolve(id))?;
        for m in &t.members {
            if m.name == 0 {
                if let Some((off, ty)) = self.member(m.type_id, name) {
                    return Some((m.bit_offset + off, ty));
                }
            } else if self.string(m.name) == name {
                return Some((m.bit_offset, m.type_id));
            }
        }
        None
    }

    /// Byte offset of `path` (member names, nested structs) inside struct `root`.
    pub(crate) fn offset_of(&self, root: &str, path: &[&str]) -> Option<u32> {
        self.by_name.get(root)?.iter().find_map(|&id| {
            let (mut id, mut bits) = (id, 0);
            for name in path {
                let (off, ty) = self.member(id, name)?;
                bits += off;
                id = ty;
            }
            (bits % 8 == 0).then_some(bits / 8)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (each as its words) and `strings`, with `gap`
    /// bytes between the header and the types (the header allows it).
    fn blob(types: &[&[u32]], strings: &[u8], gap: usize) -> Vec<u8> {
        let types: Vec<u8> = types.iter().flat_map(|t| t.iter()).flat_map(|w| w.to_le_bytes()).collect();
        let mut b = vec![0x9f, 0xeb, 1, 0];
        for w in [24, gap as u32, types.len() as u32, (gap + types.len()) as u32, strings.len() as u32] {
            b.extend(w.to_le_bytes());
        }
        b.extend(vec![0xaa; gap]);
        b.extend(types);
        b.extend(strings);
        b
    }

    #[test]
    fn members_are_found_through_anonymous_unions_and_bitfield_offsets() {
        // Strings: 1 int, 5 b, 7 outer, 13 a, 15 flags, 21 x, 23 y, 25 outer_t, 33 c.
        let strings = b"\0int\0b\0outer\0a\0flags\0x\0y\0outer_t\0c\0";
        let info = |kind: u32, vlen: u32, kind_flag: u32| kind_flag << 31 | kind << 24 | vlen;
        let types: [&[u32]; 6] = [
            // 1: int, 4 bytes.
            &[1, info(1, 0, 0), 4, 32],
            // 2: struct { int c; int b; }, anonymous (b at bit 32 of it).
            &[0, info(KIND_STRUCT, 2, 0), 8, 33, 1, 0, 5, 1, 32],
            // 3: struct outer { int a; struct { int c; int b; }; } (the anonymous one at bit 32).
            &[7, info(KIND_STRUCT, 2, 0), 12, 13, 1, 0, 0, 2, 32],
            // 4: typedef outer_t -> 3.
            &[25, info(KIND_TYPEDEF, 0, 0), 3],
            // 5: struct outer again, a second definition (modules repeat names).
            &[7, info(KIND_STRUCT, 1, 0), 4, 13, 1, 0],
            // 6 (last, so a types section cut short loses it): struct flags { int x:3; int y:5; },
            // bitfield sizes in the top byte.
            &[15, info(KIND_STRUCT, 2, 1), 8, 21, 1, 3 << 24, 23, 1, 5 << 24 | 32],
        ];
        for gap in [0, 8] {
            let btf = Btf::parse(&blob(&types, strings, gap)).expect("parses");
            assert_eq!(btf.offset_of("outer", &["a"]), Some(0), "gap {gap}");
            assert_eq!(btf.offset_of("outer", &["c"]), Some(4), "through the anonymous member at 4 bytes");
            assert_eq!(btf.offset_of("outer", &["b"]), Some(8), "its offset and the member's within it, added");
            assert_eq!(btf.offset_of("flags", &["x"]), Some(0), "a bitfield's size is not its offset");
            assert_eq!(btf.offset_of("flags", &["y"]), Some(4));
            assert_eq!(btf.offset_of("outer", &["d"]), None);
            assert_eq!(btf.offset_of("outer_t", &["a"]), None, "typedefs are not structs by name");
            assert_eq!(btf.offset_of("int", &["a"]), None);
        }
        let mut bad = blob(&types, strings, 0);
        bad[0] = 0;
        assert!(Btf::parse(&bad).is_none(), "no magic");
        let truncated = blob(&types, strings, 0);
        assert!(Btf::parse(&truncated[..truncated.len() - 3]).is_none(), "strings cut short");
    }

    #[test]
    fn finds_socket_netns_fields_on_this_kernel() {
        let Some(btf) = Btf::from_sys_fs() else {
            panic!("/sys/kernel/btf/vmlinux is needed (the machine has BTF)");
        };
        // The first member of struct sock is its sock_common.
        assert_eq!(btf.offset_of("sock", &["__sk_common"]), Some(0));
        let net = btf.offset_of("sock_common", &["skc_net"]).expect("sock_common.skc_net");
        assert!(net > 0 && net < 256, "skc_net at {net}");
        assert!(btf.offset_of("net", &["ns", "inum"]).is_some(), "net.ns.inum");
        assert_eq!(btf.offset_of("sock_common", &["no_such_member"]), None);
        // Past the request socket's common part, and 4-byte aligned (a u32).
        let isn = btf.offset_of("tcp_request_sock", &["snt_isn"]).expect("tcp_request_sock.snt_isn");
        let rcv = btf.offset_of("tcp_request_sock", &["rcv_isn"]).expect("tcp_request_sock.rcv_isn");
        assert!(isn > net && isn % 4 == 0 && isn < 1024, "snt_isn at {isn}");
        assert_eq!(isn, rcv + 4, "snt_isn follows rcv_isn (include/linux/tcp.h)");
    }
}
