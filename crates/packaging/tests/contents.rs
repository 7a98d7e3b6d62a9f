//! What every package holds, checked without building one: the RPM spec's `%files` names every
//! packaged file (the man pages and completions among them), a package listing that lacks one
//! is refused as `--verify` refuses it, and staging gzips each man page and copies each
//! completion script, refusing a page or script the binary did not write and a page the list
//! does not hold.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use packaging::assets::{self, COMPLETIONS, MAN_DIR, MAN_PAGES};
use packaging::contents;

fn spec() -> String {
    let path = test_support::workspace_root().join("packaging/rpm/choria-provisioner.spec.in");
    fs::read_to_string(path).expect("the RPM spec template is readable")
}

#[test]
fn every_package_holds_the_man_pages_and_the_completions() {
    let packaged: Vec<String> = contents::packaged()
        .into_iter()
        .map(|(p, _, _)| p)
        .collect();
    for want in [
        "usr/sbin/choria-provisioner",
        "usr/share/man/man1/choria-provisioner.1.gz",
        "usr/share/man/man1/choria-provisioner-deny-add.1.gz",
        "usr/share/man/man1/choria-provisioner-rotate-status.1.gz",
        "usr/share/bash-completion/completions/choria-provisioner",
        "usr/share/zsh/site-functions/_choria-provisioner",
        "usr/share/fish/vendor_completions.d/choria-provisioner.fish",
    ] {
        assert!(packaged.iter().any(|p| p == want), "{want} not packaged");
    }
    for (dest, mode, config) in contents::packaged() {
        if dest.starts_with("usr/share/man/") || dest.contains("completion") {
            assert_eq!((mode, config), (0o644, false), "{dest}");
        }
    }
}

#[test]
fn the_rpm_spec_lists_every_packaged_file() {
    let spec = spec();
    assert_eq!(contents::not_in_rpm_files(&spec), Vec::<String>::new());
    // Without its man page line the spec leaves every page out.
    let without: String = spec
        .lines()
        .filter(|l| !l.contains("/usr/share/man/man1/"))
        .map(|l| format!("{l}\n"))
        .collect();
    let missing = contents::not_in_rpm_files(&without);
    assert_eq!(missing.len(), MAN_PAGES.len(), "{missing:?}");
    assert!(missing.contains(&"/usr/share/man/man1/choria-provisioner-deny-ls.1.gz".to_string()));
    // `%dir` owns the directory alone, not what is below it.
    let dir_only = without.replace(
        "/usr/share/zsh/site-functions/_choria-provisioner",
        "%dir /usr/share/zsh/site-functions",
    );
    assert!(contents::not_in_rpm_files(&dir_only)
        .contains(&"/usr/share/zsh/site-functions/_choria-provisioner".to_string()));
}

#[test]
fn a_listing_without_a_man_page_or_a_completion_is_refused() {
    let listing: String = contents::packaged()
        .iter()
        .map(|(p, _, _)| format!("-rw-r--r-- root/root 1234 2026-01-01 00:00 ./{p}\n"))
        .collect();
    assert_eq!(contents::missing_from(&listing, "./"), Vec::<String>::new());
    for gone in [
        "usr/share/man/man1/choria-provisioner-policy-eval.1.gz",
        "usr/share/fish/vendor_completions.d/choria-provisioner.fish",
    ] {
        let short: String = listing
            .lines()
            .filter(|l| !l.ends_with(gone))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            contents::missing_from(&short, "./"),
            vec![format!("./{gone}")]
        );
    }
}

/// An assets directory as `generate-assets` writes it: every listed page and every script.
fn fake_assets(dir: &Path) {
    let man = dir.join("man/man1");
    fs::create_dir_all(&man).unwrap();
    for page in MAN_PAGES {
        let roff = format!(".TH {page} 1\n.SH NAME\n{page} \\- a command\n");
        fs::write(man.join(format!("{page}.1")), roff).unwrap();
    }
    for (src, _) in COMPLETIONS {
        let path = dir.join(src);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, format!("# completion {src}\n")).unwrap();
    }
}

#[test]
fn staging_gzips_every_man_page_and_copies_every_completion() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, stage) = (tmp.path().join("assets"), tmp.path().join("stage"));
    fake_assets(&src);
    assets::stage(&src, &stage).unwrap();
    for page in MAN_PAGES {
        let gz = stage.join(MAN_DIR).join(format!("{page}.1.gz"));
        let bytes = fs::read(&gz).unwrap();
        assert_eq!(&bytes[..2], [0x1f, 0x8b], "{} is not gzip", gz.display());
        let plain = Command::new("gzip").arg("-dc").arg(&gz).output().unwrap();
        assert!(plain.status.success());
        let roff = fs::read(src.join(format!("man/man1/{page}.1"))).unwrap();
        assert_eq!(plain.stdout, roff, "{}", gz.display());
        let mode = fs::metadata(&gz).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", gz.display());
    }
    for (from, to) in COMPLETIONS {
        assert_eq!(
            fs::read(stage.join(to)).unwrap(),
            fs::read(src.join(from)).unwrap()
        );
    }
    // What staging adds is what the packages are checked for, and nothing else.
    let mut staged: Vec<String> = files_under(&stage);
    staged.sort();
    let mut expected = assets::packaged();
    expected.sort();
    assert_eq!(staged, expected);
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// Staging `src` into `dir` fails, naming `what`.
fn refused(src: &Path, dir: &Path, what: &str) {
    let err = assets::stage(src, dir).unwrap_err();
    assert!(err.to_string().contains(what), "{what}: {err}");
}

#[test]
fn staging_refuses_a_missing_or_an_unlisted_page_and_a_missing_script() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("assets");

    fake_assets(&src);
    fs::remove_file(src.join("man/man1/choria-provisioner-deny-rm.1")).unwrap();
    refused(
        &src,
        &tmp.path().join("a"),
        "man/man1/choria-provisioner-deny-rm.1",
    );

    fake_assets(&src);
    let unlisted = src.join("man/man1/choria-provisioner-frobnicate.1");
    fs::write(&unlisted, ".TH x 1\n").unwrap();
    refused(
        &src,
        &tmp.path().join("b"),
        "choria-provisioner-frobnicate.1",
    );
    fs::remove_file(&unlisted).unwrap();

    fs::remove_file(src.join("completions/zsh/_choria-provisioner")).unwrap();
    refused(
        &src,
        &tmp.path().join("c"),
        "completions/zsh/_choria-provisioner",
    );
}
