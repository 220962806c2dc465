//! Just enough of a BTF reader to find field offsets of kernel structures in
//! [`VMLINUX_BTF`], so programs that read kernel memory (the kernel sampler's and the
//! steering program's `struct sock` fields) read it at the running kernel's offsets
//! (they cannot use CO-RE: they are loaded by aya without libbpf relocations).
//! Format: Documentation/bpf/btf.rst.

use std::collections::HashMap;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Where the running kernel's BTF is.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Nested anonymous members followed at most this deep (sock_common nests two).
const ANON_DEPTH_MAX: u32 = 8;

struct Ty {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// size or referenced type
    size_type: u32,
    /// (name_off, type, offset field) for struct/union members
    members: Vec<(u32, u32, u32)>,
}

/// Parsed BTF types and strings.
pub struct Btf {
    types: Vec<Ty>,
    strings: Vec<u8>,
    by_name: HashMap<(String, u32), u32>,
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

impl Btf {
    /// Parse raw little-endian BTF (as `/sys/kernel/btf/vmlinux` holds it).
    pub fn parse(b: &[u8]) -> Result<Btf, String> {
        let bad = |m: &str| format!("BTF: {m}");
        if b.len() < 24 || u16::from_le_bytes([b[0], b[1]]) != BTF_MAGIC {
            return Err(bad("no little-endian BTF header"));
        }
        let hdr_len = u32_at(b, 4).ok_or_else(|| bad("short header"))? as usize;
        let type_off = u32_at(b, 8).ok_or_else(|| bad("short header"))? as usize;
        let type_len = u32_at(b, 12).ok_or_else(|| bad("short header"))? as usize;
        let str_off = u32_at(b, 16).ok_or_else(|| bad("short header"))? as usize;
        let str_len = u32_at(b, 20).ok_or_else(|| bad("short header"))? as usize;
        let types_b = b
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or_else(|| bad("type section out of bounds"))?;
        let strings = b
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or_else(|| bad("string section out of bounds"))?
            .to_vec();
        // Type id 0 is void.
        let mut types = vec![Ty {
            name_off: 0,
            kind: 0,
            kind_flag: false,
            size_type: 0,
            members: Vec::new(),
        }];
        let mut off = 0usize;
        while off + 12 <= types_b.len() {
            let name_off = u32_at(types_b, off).expect("bounds checked");
            let info = u32_at(types_b, off + 4).expect("bounds checked");
            let size_type = u32_at(types_b, off + 8).expect("bounds checked");
            off += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let mut members = Vec::new();
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = off + i * 12;
                        members.push((
                            u32_at(types_b, m).ok_or_else(|| bad("member out of bounds"))?,
                            u32_at(types_b, m + 4).ok_or_else(|| bad("member out of bounds"))?,
                            u32_at(types_b, m + 8).ok_or_else(|| bad("member out of bounds"))?,
                        ));
                    }
                    vlen * 12
                }
                KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
                KIND_DATASEC | KIND_ENUM64 => vlen * 12,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                k => return Err(bad(&format!("unknown kind {k}"))),
            };
            off += extra;
            types.push(Ty {
                name_off,
                kind,
                kind_flag: info >> 31 == 1,
                size_type,
                members,
            });
        }
        let mut btf = Btf {
            types,
            strings,
            by_name: HashMap::new(),
        };
        for id in 1..btf.types.len() {
            let t = &btf.types[id];
            if t.kind == KIND_STRUCT && t.name_off != 0 {
                let name = btf.name(t.name_off).to_string();
                btf.by_name.entry((name, t.kind)).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    /// The running kernel's BTF ([`VMLINUX_BTF`]); the error names the file.
    pub fn kernel() -> Result<Btf, String> {
        let raw = std::fs::read(VMLINUX_BTF).map_err(|e| format!("{VMLINUX_BTF}: {e}"))?;
        Btf::parse(&raw).map_err(|e| format!("{VMLINUX_BTF}: {e}"))
    }

    fn name(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or(&[]);
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Follow typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize).map(|t| t.kind) {
                Some(KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG) => {
                    id = self.types[id as usize].size_type
                }
                _ => break,
            }
        }
        id
    }

    /// Byte offset and type of member `name` of struct/union `id`, looking through
    /// anonymous struct/union members.
    fn member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        let t = self.types.get(self.resolve(id) as usize)?;
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return None;
        }
        for &(n, ty, off) in &t.members {
            let bits = if t.kind_flag { off & 0xff_ffff } else { off };
            if n != 0 && self.name(n) == name {
                return Some((bits / 8, ty));
            }
            if n == 0 && depth < ANON_DEPTH_MAX {
                if let Some((o, mt)) = self.member(ty, name, depth + 1) {
                    return Some((bits / 8 + o, mt));
                }
            }
        }
        None
    }

    /// Byte offset of `path` (member names, each looked up through anonymous members)
    /// inside `struct strukt`.
    pub fn offset_of(&self, strukt: &str, path: &[&str]) -> Option<u32> {
        let mut id = *self.by_name.get(&(strukt.to_string(), KIND_STRUCT))?;
        let mut total = 0;
        for m in path {
            let (o, ty) = self.member(id, m, 0)?;
            total += o;
            id = ty;
        }
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's `struct sock` (skipped where the kernel has no BTF).
    #[test]
    fn finds_sock_fields_in_the_kernel_btf() {
        let Ok(raw) = std::fs::read(VMLINUX_BTF) else {
            return;
        };
        let btf = Btf::parse(&raw).unwrap();
        // sock_common: skc_addrpair (8), skc_hash (4), skc_dport (2), skc_num (2),
        // skc_family (2), skc_state (1): unchanged since 2.6.
        assert_eq!(btf.offset_of("sock", &["__sk_common", "skc_num"]), Some(14));
        assert_eq!(
            btf.offset_of("sock", &["__sk_common", "skc_state"]),
            Some(18)
        );
        let ack = btf.offset_of("sock", &["sk_ack_backlog"]).unwrap();
        assert!(ack > 18, "{ack}");
        assert_eq!(btf.offset_of("sock", &["no_such_field"]), None);
        assert!(btf.offset_of("sock", &["__sk_common", "skc_net"]).is_some());
        assert!(btf.offset_of("net", &["ns", "inum"]).is_some());
        assert!(Btf::parse(&raw[..10]).is_err());
    }
}
