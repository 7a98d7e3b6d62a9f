//! The ELF reader `cargo xtask dist --verify` judges release binaries with: it finds the loader,
//! the libraries and the highest `GLIBC_` version of a dynamically linked binary (this test's
//! own), refuses what is not a 64-bit ELF file without panicking, and holds the musl release
//! binaries and the packaged binaries already built to what the packages promise: static, or
//! glibc 2.17 at most.

use packaging::elf;

#[test]
fn a_glibc_binary_names_its_loader_libraries_and_glibc_version() {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let bytes = std::fs::read(&exe).expect("the test binary is readable");
    let l = elf::linkage(&bytes).expect("the test binary is an ELF file");
    let machine = match std::env::consts::ARCH {
        "x86_64" => elf::Machine::X86_64,
        "aarch64" => elf::Machine::Aarch64,
        _ => return,
    };
    assert_eq!(l.machine, machine);
    if !cfg!(target_env = "gnu") {
        return;
    }
    assert!(!l.is_static(), "{l}");
    assert!(
        l.interpreter
            .as_deref()
            .is_some_and(|i| i.contains("ld-linux")),
        "{l}"
    );
    assert!(l.needed.iter().any(|n| n.starts_with("libc.so")), "{l}");
    // Every glibc binary needs at least the oldest symbol versions (2.2.5 on x86_64, 2.17 on
    // aarch64), so a missing version means the table was not read.
    let v = l.glibc.expect("a glibc binary names GLIBC_ versions");
    assert!(v >= (2, 2), "{l}");
    assert_eq!(l.glibc_text(), Some(format!("{}.{}", v.0, v.1)));
}

#[test]
fn what_is_not_a_64_bit_elf_file_is_refused() {
    assert!(elf::linkage(b"#!/bin/sh\necho hi\n").is_err());
    assert!(elf::linkage(b"\x7fELF").is_err());
    let mut elf32 = b"\x7fELF\x01\x01\x01".to_vec();
    elf32.resize(64, 0);
    assert!(elf::linkage(&elf32).is_err());
    // A header whose program headers lie past the end of the file.
    let mut cut = b"\x7fELF\x02\x01\x01".to_vec();
    cut.resize(64, 0);
    cut[32] = 0xff;
    cut[56] = 1;
    assert!(elf::linkage(&cut).is_err());
}

#[test]
fn glibc_versions_compare_by_major_and_minor() {
    assert_eq!(elf::parse_version("2.17"), Some((2, 17)));
    assert_eq!(elf::parse_version("2.2.5"), Some((2, 2)));
    assert_eq!(elf::parse_version("2"), Some((2, 0)));
    assert_eq!(elf::parse_version("PRIVATE"), None);
    assert!(elf::parse_version("2.34") > elf::parse_version("2.17"));
}

#[test]
fn release_binaries_are_static_or_need_glibc_2_17_at_most() {
    let target = packaging::target_dir(&test_support::workspace_root());
    let mut found = Vec::new();
    for arch in ["x86_64", "aarch64"] {
        found.push(target.join(format!(
            "{arch}-unknown-linux-musl/release/choria-provisioner"
        )));
        found.push(target.join(format!("dist/{arch}/stage/usr/sbin/choria-provisioner")));
    }
    found.retain(|p| p.is_file());
    if found.is_empty() {
        eprintln!("skipped: no release binary built for a target (cargo xtask dist builds them)");
        return;
    }
    for binary in found {
        let bytes = std::fs::read(&binary).expect("the binary is readable");
        let l = elf::linkage(&bytes).expect("the binary is an ELF file");
        let musl = binary.to_string_lossy().contains("-musl/");
        assert!(!musl || l.is_static(), "{}: {l}", binary.display());
        if let Some(v) = l.glibc {
            assert!(v <= (2, 17), "{} needs glibc {v:?}: {l}", binary.display());
        }
        eprintln!("{}: {l}", binary.display());
    }
}
