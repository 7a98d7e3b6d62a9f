//! How a release binary is linked, read from its ELF headers: whether it needs a dynamic loader
//! and libraries, and the highest `GLIBC_x.y` symbol version it needs, which is the oldest glibc
//! it runs on. Only what the dynamic loader itself reads is consulted (the program headers, the
//! dynamic section and its version-needed table), so a `GLIBC_` string elsewhere in the file
//! (a message, a symbol name) does not count.

use std::fmt;

/// The machine an ELF file is for, as `e_machine` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    X86_64,
    Aarch64,
    Other(u16),
}

/// What the dynamic loader needs to run a binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linkage {
    pub machine: Machine,
    /// `PT_INTERP`: the dynamic loader it names, if any.
    pub interpreter: Option<String>,
    /// `DT_NEEDED`: the shared libraries it needs.
    pub needed: Vec<String>,
    /// The highest `GLIBC_x.y` version in its version-needed table.
    pub glibc: Option<(u32, u32)>,
}

impl Linkage {
    /// Static: no loader and no library (a static-pie binary has a dynamic section for its own
    /// relocations, but neither of these).
    pub fn is_static(&self) -> bool {
        self.interpreter.is_none() && self.needed.is_empty()
    }

    /// The glibc it needs at least, as `x.y`.
    pub fn glibc_text(&self) -> Option<String> {
        self.glibc.map(|(a, b)| format!("{a}.{b}"))
    }
}

impl fmt::Display for Linkage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let machine = match self.machine {
            Machine::X86_64 => "x86_64".to_string(),
            Machine::Aarch64 => "aarch64".to_string(),
            Machine::Other(m) => format!("machine {m}"),
        };
        if self.is_static() {
            return write!(f, "{machine}, static (no loader, no shared library)");
        }
        write!(
            f,
            "{machine}, loader {}, needs {}",
            self.interpreter.as_deref().unwrap_or("none"),
            self.needed.join(" ")
        )?;
        match self.glibc_text() {
            Some(v) => write!(f, ", glibc {v} or newer"),
            None => write!(f, ", no GLIBC_ version"),
        }
    }
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_VERNEED: u64 = 0x6fff_fffe;
const DT_VERNEEDNUM: u64 = 0x6fff_ffff;

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn slice(&self, at: u64, len: u64) -> Result<&[u8], String> {
        let start = usize::try_from(at).map_err(|_| "offset out of range".to_string())?;
        let len = usize::try_from(len).map_err(|_| "length out of range".to_string())?;
        start
            .checked_add(len)
            .and_then(|end| self.bytes.get(start..end))
            .ok_or_else(|| format!("truncated ELF file (wanted {len} bytes at {start})"))
    }

    fn u16(&self, at: u64) -> Result<u16, String> {
        let b = self.slice(at, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&self, at: u64) -> Result<u32, String> {
        let b = self.slice(at, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&self, at: u64) -> Result<u64, String> {
        let b = self.slice(at, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// The NUL-terminated string at `at`.
    fn str(&self, at: u64) -> Result<String, String> {
        let start = usize::try_from(at).map_err(|_| "offset out of range".to_string())?;
        let rest = self
            .bytes
            .get(start..)
            .ok_or_else(|| "string outside the file".to_string())?;
        let end = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| "unterminated string".to_string())?;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
}

/// Reads the linkage of a 64-bit little-endian ELF executable (x86_64, aarch64).
pub fn linkage(bytes: &[u8]) -> Result<Linkage, String> {
    let r = Reader { bytes };
    if r.slice(0, 4)? != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    let class_and_order = r.slice(4, 2)?;
    if class_and_order != [2, 1] {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let machine = match r.u16(18)? {
        62 => Machine::X86_64,
        183 => Machine::Aarch64,
        m => Machine::Other(m),
    };
    let phoff = r.u64(32)?;
    let phentsize = u64::from(r.u16(54)?);
    let phnum = u64::from(r.u16(56)?);

    // (vaddr, offset, filesz) of each loaded segment, to turn the dynamic section's addresses
    // into file offsets.
    let mut loads = Vec::new();
    let mut interpreter = None;
    let mut dynamic = None;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        let kind = r.u32(ph)?;
        let offset = r.u64(ph + 8)?;
        let vaddr = r.u64(ph + 16)?;
        let filesz = r.u64(ph + 32)?;
        match kind {
            PT_LOAD => loads.push((vaddr, offset, filesz)),
            PT_INTERP => interpreter = Some(r.str(offset)?),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    let file_offset = |addr: u64| -> Result<u64, String> {
        loads
            .iter()
            .find(|(vaddr, _, size)| addr >= *vaddr && addr < vaddr + size)
            .map(|(vaddr, offset, _)| addr - vaddr + offset)
            .ok_or_else(|| format!("address {addr:#x} is in no loaded segment"))
    };

    let mut needed_at = Vec::new();
    let (mut strtab, mut verneed, mut verneednum) = (None, None, 0);
    if let Some((offset, size)) = dynamic {
        for i in 0..size / 16 {
            let tag = r.u64(offset + i * 16)?;
            let val = r.u64(offset + i * 16 + 8)?;
            match tag {
                DT_NULL => break,
                DT_NEEDED => needed_at.push(val),
                DT_STRTAB => strtab = Some(file_offset(val)?),
                DT_VERNEED => verneed = Some(file_offset(val)?),
                DT_VERNEEDNUM => verneednum = val,
                _ => {}
            }
        }
    }
    let name = |at: u64| -> Result<String, String> {
        let table = strtab.ok_or_else(|| "dynamic section without a string table".to_string())?;
        r.str(table + at)
    };
    let needed = needed_at
        .into_iter()
        .map(name)
        .collect::<Result<Vec<_>, _>>()?;

    // Elf64_Verneed { vn_version: u16, vn_cnt: u16, vn_file: u32, vn_aux: u32, vn_next: u32 }
    // Elf64_Vernaux { vna_hash: u32, vna_flags: u16, vna_other: u16, vna_name: u32, vna_next: u32 }
    let mut glibc: Option<(u32, u32)> = None;
    if let Some(mut at) = verneed {
        for _ in 0..verneednum {
            let count = r.u16(at + 2)?;
            let mut aux = at + u64::from(r.u32(at + 8)?);
            for _ in 0..count {
                let version = name(u64::from(r.u32(aux + 8)?))?;
                if let Some(v) = version.strip_prefix("GLIBC_").and_then(parse_version) {
                    if glibc.is_none_or(|g| v > g) {
                        glibc = Some(v);
                    }
                }
                aux += u64::from(r.u32(aux + 12)?);
            }
            let next = r.u32(at + 12)?;
            if next == 0 {
                break;
            }
            at += u64::from(next);
        }
    }
    Ok(Linkage {
        machine,
        interpreter,
        needed,
        glibc,
    })
}

/// `2.17` as (2, 17); `2.2.5` as (2, 2) (the third part never decides the oldest glibc here).
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((major, minor))
}
