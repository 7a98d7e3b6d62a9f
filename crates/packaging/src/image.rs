//! `cargo xtask dist --image`: the container image (packaging/Containerfile), `FROM scratch`
//! with the static release binary, built with podman or buildah in Docker format so that its
//! HEALTHCHECK is kept, and saved as a `docker-archive` that `podman load` and `docker load`
//! read. With `--verify` it runs under podman with the host's network against test-support's
//! nats-server and provisions a simulated fleet through the demo helper's webhook.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use test_support::stack::write_run_files;
use test_support::webhook::WebhookPlan;
use test_support::{Mode, NatsServer};

use crate::build::{install_file, set_mode, write_file};
use crate::error::{bail, Context, Result};
use crate::fleet::{uids, SimFleet};
use crate::host::{apt_install, capture, combined, run, section, which};
use crate::{linkage, root, target_dir, PackageSet, FLEET_SIM, NAME};

/// The image's user, as in the Go provisioner's image.
const UID: u32 = 2048;
const USER: &str = "choria";
/// The image's working directory, where the configuration is mounted.
const ETC: &str = "/etc/choria-provisioner";
/// The CA bundle a webhook helper's HTTPS client reads (rustls' native roots look here).
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";
/// Simulated servers the image provisions.
const NODES: usize = 10;

/// A built image.
pub struct Image {
    /// `localhost/choria-provisioner:VERSION`.
    pub name: String,
    /// The saved image.
    pub archive: PathBuf,
}

/// podman, else buildah (podman is installed from Debian when neither is there).
fn builder() -> Result<PathBuf> {
    if let Ok(p) = which("podman").or_else(|_| which("buildah")) {
        return Ok(p);
    }
    println!("dist: neither podman nor buildah found, installing Debian's podman");
    apt_install(&["podman"], true);
    which("podman").context("podman not found and could not be installed: apt-get install podman")
}

/// Builds the image from `set`'s staged static binary into `out`.
pub fn build(root: &Path, set: &PackageSet, version: &str, out: &Path) -> Result<Image> {
    let binary = set.binary();
    let linked = linkage(&binary)?;
    if !linked.is_static() {
        bail!(
            "the image holds only the binary, which must be static, but {} is {linked}: use a \
             musl target",
            set.target.spec
        );
    }
    let tool = builder()?;
    let ctx = out.join("image");
    if ctx.exists() {
        fs::remove_dir_all(&ctx)?;
    }
    // The tree owned by root, then what belongs to the image's user, appended to one archive
    // with its owners (the Containerfile's ADD keeps them).
    let system = ctx.join("system");
    let user = ctx.join("user");
    install_file(&binary, &system.join("usr/sbin").join(NAME), 0o755)?;
    // The fleet simulator, for load tests from the image (`--entrypoint`).
    install_file(
        &set.fleet_sim(),
        &system.join("usr/bin").join(FLEET_SIM),
        0o755,
    )?;
    for (file, mode) in [("LICENSE", 0o644), ("README.md", 0o644)] {
        install_file(
            &root.join(file),
            &system.join("usr/share/doc").join(NAME).join(file),
            mode,
        )?;
    }
    write_file(
        &system.join("etc/passwd"),
        &format!(
            "root:x:0:0:root:/root:/sbin/nologin\n\
             {USER}:x:{UID}:{UID}:Choria Orchestrator - choria.io:/home/{USER}:/sbin/nologin\n"
        ),
        0o644,
    )?;
    write_file(
        &system.join("etc/group"),
        &format!("root:x:0:\n{USER}:x:{UID}:\n"),
        0o644,
    )?;
    let bundle = Path::new("/").join(CA_BUNDLE);
    if !bundle.is_file() {
        apt_install(&["ca-certificates"], true);
    }
    install_file(&bundle, &system.join(CA_BUNDLE), 0o644).with_context(|| {
        format!(
            "{} is missing: apt-get install ca-certificates",
            bundle.display()
        )
    })?;
    fs::create_dir_all(system.join("tmp"))?;
    set_mode(&system.join("tmp"), 0o1777)?;
    for dir in [ETC.trim_start_matches('/'), &format!("home/{USER}")] {
        fs::create_dir_all(user.join(dir))?;
        set_mode(&user.join(dir), 0o750)?;
    }
    let tar = ctx.join("rootfs.tar");
    let tar_cmd = |mode: &str, dir: &Path, owner: u32, paths: &[&str]| {
        let mut c = Command::new("tar");
        c.arg(mode)
            .arg(&tar)
            .arg(format!("--owner={owner}"))
            .arg(format!("--group={owner}"))
            .args(["--numeric-owner", "--sort=name", "-C"])
            .arg(dir)
            .args(paths);
        c
    };
    run(&mut tar_cmd("-cf", &system, 0, &["."]))?;
    run(&mut tar_cmd(
        "-rf",
        &user,
        UID,
        &[&format!(".{ETC}"), &format!("./home/{USER}")],
    ))?;
    fs::remove_dir_all(&system)?;
    fs::remove_dir_all(&user)?;
    fs::copy(
        root.join("packaging/Containerfile"),
        ctx.join("Containerfile"),
    )?;

    let name = format!("localhost/{NAME}:{version}");
    let started = Instant::now();
    let mut cmd = Command::new(&tool);
    if tool.ends_with("buildah") {
        cmd.arg("bud");
    } else {
        cmd.arg("build");
    }
    run(cmd
        .args(["--format", "docker", "--build-arg"])
        .arg(format!("VERSION={version}"))
        .args(["-t", &name, "-f"])
        .arg(ctx.join("Containerfile"))
        .arg(&ctx))?;
    let archive = out.join(format!(
        "{NAME}-{version}-image-{}.tar",
        set.target.arch.name()
    ));
    let _ = fs::remove_file(&archive);
    let tool_name = tool.file_name().unwrap_or_default().to_string_lossy();
    if tool_name == "buildah" {
        run(Command::new(&tool)
            .arg("push")
            .arg(&name)
            .arg(format!("docker-archive:{}:{name}", archive.display())))?;
    } else {
        run(Command::new(&tool)
            .args(["save", "--format", "docker-archive", "-o"])
            .arg(&archive)
            .arg(&name))?;
    }
    println!(
        "dist: image {name} built with {tool_name} in {:.0}s, saved as {} ({} KiB)",
        started.elapsed().as_secs_f64(),
        archive.display(),
        fs::metadata(&archive)?.len() / 1024
    );
    Ok(Image { name, archive })
}

/// A container removed when dropped, whatever happened.
struct Container {
    podman: PathBuf,
    name: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.podman)
            .args(["rm", "-f", "-t", "5", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs the image under podman with the host's network: its configuration, and nothing else,
/// mounted on /etc/choria-provisioner; checks its user, files and healthcheck, and that it
/// provisions [`NODES`] simulated servers.
pub fn provision_fleet(image: &Image, bins: &Path) -> Result<()> {
    if which("podman").is_err() || which("runc").is_err() {
        apt_install(&["podman", "runc"], true);
    }
    let podman = which("podman")
        .context("podman not found and could not be installed: apt-get install podman")?;
    // The image as its archive holds it, not only as the local store has it.
    run(Command::new(&podman)
        .arg("load")
        .arg("-q")
        .arg("-i")
        .arg(&image.archive)
        .stdout(Stdio::null()))?;
    image_config(&podman, &image.name)?;
    image_files(&podman, &image.name)?;

    let dir = target_dir(&root()).join("dist/image-test");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let container = Container {
        podman: podman.clone(),
        name: format!("choria-provisioner-dist-{}", std::process::id()),
    };
    let result = fleet(&container, image, bins, &dir);
    if result.is_err() {
        let logs = Command::new(&podman)
            .args(["logs", &container.name])
            .output()
            .map(|o| combined(&o))
            .unwrap_or_default();
        let tail: Vec<&str> = logs.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        section("podman logs (end)", &tail.join("\n"));
        section(
            "fleet-sim.log (end)",
            &test_support::logs::tail(&dir.join("fleet-sim.log"), 30),
        );
    }
    result
}

/// The image's user, working directory, entry point and healthcheck.
fn image_config(podman: &Path, name: &str) -> Result<()> {
    let text = capture(Command::new(podman).args(["image", "inspect"]).arg(name))?;
    let all: serde_json::Value = serde_json::from_str(text.trim())
        .with_context(|| format!("podman image inspect printed {text:?}"))?;
    let v = &all[0];
    let config = &v["Config"];
    let s = |k: &str| config[k].as_str().unwrap_or_default();
    let health = v["Healthcheck"]["Test"].to_string();
    if s("User") != USER
        || s("WorkingDir").trim_end_matches('/') != ETC
        || !config["Entrypoint"]
            .to_string()
            .contains("/usr/sbin/choria-provisioner")
        || !health.contains("status")
    {
        bail!(
            "the image's configuration is not as packaging/Containerfile says: {config}, \
             healthcheck {health}"
        );
    }
    println!(
        "ok: the image runs /usr/sbin/choria-provisioner as {USER} in {ETC}, healthcheck {health}"
    );
    Ok(())
}

/// `podman` with the container runtime that works here: runc where it is installed, since
/// crun refuses a hybrid cgroup hierarchy whose cgroup2 has controllers (as on these machines).
fn podman_cmd(podman: &Path) -> Command {
    let mut c = Command::new(podman);
    if let Ok(runc) = which("runc") {
        c.arg("--runtime").arg(runc);
    }
    c
}

/// The test container's limits. podman gives a container 1048576 open files and more processes
/// than it keeps for itself, which the runtime can only set with CAP_SYS_RESOURCE; a sandboxed
/// root (as on these machines) lacks it, and the container would not start. So the container
/// gets this process's hard limit of open files (at most podman's default) and 4096 processes,
/// far more than the daemon's threads and helpers.
fn ulimits() -> [String; 2] {
    let hard = fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(4).map(str::to_string))
        })
        .and_then(|h| h.parse::<u64>().ok());
    let nofile = hard.unwrap_or(1024).min(1_048_576);
    [
        format!("--ulimit=nofile={nofile}:{nofile}"),
        "--ulimit=nproc=4096:4096".to_string(),
    ]
}

/// The files of the image and their owners: the binary root's, the configuration directory
/// the user's.
fn image_files(podman: &Path, name: &str) -> Result<()> {
    let id = capture(Command::new(podman).args(["create", name]))?;
    let id = id.trim();
    let export = Command::new(podman).args(["export", id]).output();
    let _ = Command::new(podman)
        .args(["rm", id])
        .stdout(Stdio::null())
        .status();
    let export = export?;
    let tmp = target_dir(&root()).join("dist/image-export.tar");
    fs::write(&tmp, &export.stdout)?;
    let listing = capture(
        Command::new("tar")
            .args(["-tvf"])
            .arg(&tmp)
            .arg("--numeric-owner"),
    );
    let _ = fs::remove_file(&tmp);
    let listing = listing?;
    section("image files", &listing);
    for (path, want) in [
        ("usr/sbin/choria-provisioner", "-rwxr-xr-x 0/0"),
        ("usr/bin/choria-fleet-sim", "-rwxr-xr-x 0/0"),
        ("etc/passwd", "-rw-r--r-- 0/0"),
        (CA_BUNDLE, "-rw-r--r-- 0/0"),
        ("etc/choria-provisioner/", "drwxr-x--- 2048/2048"),
        ("home/choria/", "drwxr-x--- 2048/2048"),
    ] {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!(" {path}")) || l.ends_with(&format!(" ./{path}")))
            .with_context(|| format!("the image has no {path}"))?;
        if !line.starts_with(want) {
            bail!("in the image: {line}, expected {want}");
        }
    }
    println!("ok: the image holds the binary (root's), its passwd and CA bundle, and {ETC} and /home/{USER} owned by {USER}");
    Ok(())
}

fn fleet(container: &Container, image: &Image, bins: &Path, dir: &Path) -> Result<()> {
    let podman = &container.podman;
    let nats = NatsServer::start_in_free_port(dir, "", true)?;
    let url = nats.url();
    let files = write_run_files(&dir.join("run"), bins)?;
    // The configuration directory mounted on /etc/choria-provisioner: the two files the image's
    // command names and the webhook's secret, the user's alone.
    let conf = dir.join("conf");
    let plan = WebhookPlan::new(&conf)?;
    let _webhook = plan.start(bins, &files, &url, &dir.join("webhook.log"))?;
    let mut settings = files
        .provisioner(dir, &url, &plan.url, Mode::Plain)
        .yaml(&format!("helper_secret_file: {ETC}/helper.secret\n"));
    settings.logfile = None;
    settings.loglevel = "info".into();
    let (yaml, cfg) = settings.write(&conf)?;
    fs::rename(&yaml, conf.join("choria-provisioner.yaml"))?;
    fs::rename(&cfg, conf.join("client.cfg"))?;
    run(Command::new("chown")
        .args(["-R", &format!("{UID}:{UID}")])
        .arg(&conf))?;
    set_mode(&conf, 0o750)?;

    let started = Instant::now();
    run(podman_cmd(podman)
        .args(["run", "-d", "--name", &container.name, "--network", "host"])
        .args(ulimits())
        .arg("-v")
        .arg(format!("{}:{ETC}:ro", conf.display()))
        .arg(&image.name)
        .stdout(Stdio::null()))?;
    let pid = capture(
        Command::new(podman)
            .args(["inspect", "--format", "{{.State.Pid}}"])
            .arg(&container.name),
    )?;
    let pid: u32 = pid.trim().parse().context("podman inspect names no pid")?;
    let uids = uids(pid).context("the container's process")?;
    if uids.iter().any(|u| *u != UID.to_string()) {
        bail!("the container's process runs with uids {uids:?}, expected uid {UID} ({USER})");
    }
    println!("ok: the container's provisioner runs as uid {UID} ({USER})");

    // Ready when /healthz answers.
    let port = settings.monitor_port;
    let ready_by = Instant::now() + Duration::from_secs(30);
    while test_support::metrics::http_get(port, "/healthz").map(|(s, _)| s) != Some(200) {
        if Instant::now() > ready_by {
            bail!("the container's /healthz on port {port} did not answer 200 within 30 s");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("ok: the container's /healthz answers 200 on port {port}");
    let health = podman_cmd(podman)
        .args(["healthcheck", "run", &container.name])
        .output()?;
    if !health.status.success() {
        bail!(
            "podman healthcheck run reports the container unhealthy: {}{}",
            String::from_utf8_lossy(&health.stdout).trim(),
            String::from_utf8_lossy(&health.stderr).trim()
        );
    }
    println!("ok: podman healthcheck run: healthy");

    let mut sim = SimFleet::start(
        &files,
        bins,
        &url,
        (NODES, Mode::Plain, "image-node"),
        &dir.join("fleet-sim.log"),
        Duration::from_secs(150),
    )?;
    let st = sim.wait("by the container", || false)?;
    let metrics = test_support::metrics::scrape(port);
    sim.check(st, &metrics, "by the container")?;
    let elapsed = started.elapsed();
    run(podman_cmd(podman)
        .args(["stop", "-t", "15", &container.name])
        .stdout(Stdio::null()))?;
    let code = capture(
        Command::new(podman)
            .args(["inspect", "--format", "{{.State.ExitCode}}"])
            .arg(&container.name),
    )?;
    if code.trim() != "0" {
        bail!("the container exited with {} on podman stop", code.trim());
    }
    println!(
        "ok: the image provisioned {NODES} simulated servers under podman ({}, webhook helper) \
         in {:.1}s and stopped cleanly",
        Mode::Plain.name(),
        elapsed.as_secs_f64()
    );
    Ok(())
}
