//! Tests of `config`.
#![allow(clippy::unwrap_used)]

#[test]
fn plugin_d_choria_cfg_is_merged_as_go_choria_merges_it() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("client.cfg");
    std::fs::write(
        &main,
        "identity = prov1.example.net\n\
             plugin.choria.middleware_hosts = nats://main.example.net:4222\n\
             plugin.security.provider = file\n",
    )
    .unwrap();
    let d = dir.path().join("plugin.d");
    std::fs::create_dir(&d).unwrap();
    // choria.cfg's keys are plugin.choria.<key>, and win over the main file.
    std::fs::write(
        d.join("choria.cfg"),
        "# brokers from the deployment tool\n\
             middleware_hosts = nats://a.example.net:4222, nats://b.example.net:4222\n\
             use_srv = false\n",
    )
    .unwrap();
    // Another plugin's file is read but, as in go-choria, not applied to the settings.
    std::fs::write(d.join("security.cfg"), "provider = choria\n").unwrap();
    std::fs::write(d.join("README"), "middleware_hosts = nats://no:1\n").unwrap();
    let c = ChoriaConfig::load(&main).unwrap();
    assert_eq!(
        c.middleware_hosts,
        ["nats://a.example.net:4222", "nats://b.example.net:4222"]
    );
    assert_eq!(c.raw["plugin.choria.use_srv"], "false");
    assert_eq!(c.security_provider, SecurityProvider::File);
    assert_eq!(c.identity, "prov1.example.net");
    assert_eq!(
        c.plugin_files,
        [d.join("choria.cfg"), d.join("security.cfg")]
    );

    // No plugin.d for a file under the home directory (go-choria's rule).
    assert_eq!(plugin_dir(&main, Some(dir.path().to_path_buf())), None);
    assert_eq!(plugin_dir(&main, None), Some(d.clone()));
    assert_eq!(plugin_dir(&main, Some("/".into())), Some(d.clone()));
}

#[test]
fn keys_go_choria_reads_and_this_client_does_not_are_named() {
    let c = ChoriaConfig::parse_str(
        "identity = p1\n\
             plugin.security.cipher_suites = TLS_AES_128_GCM_SHA256\n\
             plugin.choria.security.request_signer.url = https://aaa.example.net/sign\n\
             plugin.choria.middleware_hosts = nats://b:4222\n\
             plugin.myagent.setting = 1\n",
    )
    .unwrap();
    assert_eq!(
        c.unread_go_keys(),
        [
            "plugin.choria.security.request_signer.url",
            "plugin.security.cipher_suites"
        ]
    );
}

#[test]
fn an_oversized_configuration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("client.cfg");
    std::fs::write(&main, "#".repeat(MAX_FILE as usize + 1)).unwrap();
    let e = ChoriaConfig::load(&main).unwrap_err().to_string();
    assert!(e.contains("larger than"), "{e}");
}

#[test]
fn the_fqdn_is_the_hosts_file_name_of_the_short_name() {
    let hosts = "127.0.0.1 localhost\n\
                     # 10.0.0.9 prov1.wrong.example\n\
                     10.0.0.5 prov1.lon.example.net prov1 # the host\n\
                     10.0.0.6 other.example.net other\n";
    assert_eq!(
        hosts_fqdn("prov1", hosts).as_deref(),
        Some("prov1.lon.example.net")
    );
    assert_eq!(
        hosts_fqdn("PROV1", hosts).as_deref(),
        Some("prov1.lon.example.net")
    );
    assert_eq!(hosts_fqdn("nothere", hosts), None);
    // A line naming the host with no qualified name of it gives nothing.
    assert_eq!(
        hosts_fqdn("solo", "10.0.0.7 solo other.example.net\n"),
        None
    );
}

#[test]
fn the_host_name_comes_from_the_kernel() {
    let name = host_name();
    assert!(!name.is_empty());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    if !kernel.trim().is_empty() {
        assert_eq!(name, kernel.trim());
    }
}
use super::*;

const SAMPLE: &str = "
# a comment
identity = prov.example.net
collectives = mcollective, other
plugin.choria.middleware_hosts = broker1:4222,tls://broker2.example.net:4443 , nats://b3:4222
plugin.security.provider = file
plugin.security.file.certificate = ~/cert.pem
plugin.security.file.key=/k.pem
plugin.nats.user = alice
plugin.nats.pass = a=b
ttl = 90
discovery_timeout = 3
plugin.choria.network.connect_timeout = 1m30s
plugin.security.issuer.names = acme
  plugin.security.issuer.acme.public = abcd
ttl = 120
";

#[test]
fn parses_keys_comments_and_overrides() {
    let c = ChoriaConfig::parse_str(SAMPLE).unwrap();
    assert_eq!(c.identity, "prov.example.net");
    assert_eq!(c.collectives, vec!["mcollective", "other"]);
    assert_eq!(c.main_collective, "mcollective");
    assert_eq!(c.security_provider, SecurityProvider::File);
    assert_eq!(c.file_key.as_deref(), Some(Path::new("/k.pem")));
    assert!(
        !c.file_certificate
            .as_ref()
            .unwrap()
            .to_string_lossy()
            .starts_with('~')
            || home_dir().is_none()
    );
    assert_eq!(c.nats_user.as_deref(), Some("alice"));
    assert_eq!(c.nats_pass.as_deref(), Some("a=b"));
    assert_eq!(c.ttl, 120, "a later line overrides an earlier one");
    assert_eq!(c.discovery_timeout, Duration::from_secs(3));
    assert_eq!(c.connect_timeout, Duration::from_secs(90));
    assert_eq!(c.raw["plugin.security.issuer.acme.public"], "abcd");
    assert_eq!(
        c.middleware_hosts
            .iter()
            .map(|h| parse_middleware_host(h).unwrap())
            .collect::<Vec<_>>(),
        vec![
            "nats://broker1:4222",
            "tls://broker2.example.net:4443",
            "nats://b3:4222"
        ]
    );
    assert!(
        !format!("{c:?}").contains("a=b"),
        "password leaked into Debug"
    );
}

#[test]
fn debug_redacts_every_password_token_and_seed_and_shows_the_rest() {
    let mut c = ChoriaConfig::parse_str(
        "identity = prov.example.net\n\
             plugin.nats.user = alice\n\
             plugin.nats.pass = nats-5b0c3e-secret\n\
             plugin.choria.network.system.password = sys-91f0aa-secret\n\
             plugin.security.choria.token_file = /etc/p/signer.jwt\n\
             plugin.security.choria.seed_file = /etc/p/signer.seed\n\
             plugin.security.provisioning.token = tok-2d44e1-secret\n",
    )
    .unwrap();
    let text = format!("{c:?}");
    for secret in ["nats-5b0c3e", "sys-91f0aa", "tok-2d44e1"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    for shown in [
        "prov.example.net",
        "alice",
        "/etc/p/signer.jwt",
        "/etc/p/signer.seed",
        "plugin.nats.pass",
        "<redacted>",
    ] {
        assert!(text.contains(shown), "{shown} missing from {text}");
    }
    let o = ProvisionerOverrides {
        broker_provisioning_password: Some("prov-6a7c1d-secret".into()),
        loglevel: Some("warn".into()),
        ..Default::default()
    };
    let text = format!("{o:?} {o:#?}");
    assert!(!text.contains("prov-6a7c1d"), "{text}");
    assert!(
        text.contains("<redacted>") && text.contains("warn"),
        "{text}"
    );
    // The override lands in nats_pass, which is redacted too.
    c.apply_provisioner_overrides(&o);
    let text = format!("{c:#?}");
    assert!(!text.contains("prov-6a7c1d"), "{text}");
    assert!(!text.contains("nats-5b0c3e"), "{text}");
}

#[test]
fn defaults_apply() {
    let c = ChoriaConfig::parse_str("").unwrap();
    assert_eq!(c.collectives, vec!["mcollective"]);
    assert_eq!(c.main_collective, "mcollective");
    assert_eq!(c.ttl, 60);
    assert_eq!(c.loglevel, "info");
    assert_eq!(c.logfile, "stdout");
    assert_eq!(c.security_provider, SecurityProvider::Puppet);
    assert!(c.puppet.is_some(), "puppet paths not resolved");
    assert!(!c.identity.is_empty());
    assert!(c.middleware_hosts.is_empty());
    let c = ChoriaConfig::parse_str("plugin.security.provider = choria").unwrap();
    assert_eq!(c.collectives, vec!["choria"]);
}

#[test]
fn provisioner_overrides_follow_the_go_provisioner() {
    let mut c = ChoriaConfig::parse_str(SAMPLE).unwrap();
    c.apply_provisioner_overrides(&ProvisionerOverrides {
        insecure: true,
        broker_provisioning_password: Some("s3cret".into()),
        loglevel: Some("warn".into()),
        logfile: Some("/var/log/p.log".into()),
        debug: true,
    });
    assert_eq!(c.collectives, vec!["provisioning"]);
    assert_eq!(c.main_collective, "provisioning");
    assert_eq!(c.loglevel, "debug");
    assert_eq!(c.logfile, "/var/log/p.log");
    assert!(c.disable_tls && c.insecure);
    assert_eq!(c.nats_user.as_deref(), Some("provisioner"));
    assert_eq!(c.nats_pass.as_deref(), Some("s3cret"));
    let sec = c.security().unwrap();
    assert!(sec.caller_id().starts_with("choria="));
    assert_eq!(sec.version(), crate::protocol::ProtocolVersion::V1);

    let mut c = ChoriaConfig::parse_str("plugin.security.provider = puppet").unwrap();
    c.apply_provisioner_overrides(&ProvisionerOverrides {
        loglevel: Some("warn".into()),
        ..Default::default()
    });
    assert_eq!(c.loglevel, "warn");
    assert!(!c.insecure);
    assert_eq!(c.security_provider, SecurityProvider::Puppet);
    // Without the files the puppet provider names the missing certificate.
    c.puppet = Some(PuppetSettings::resolve(
        Some(Path::new("/nonexistent/ssl")),
        true,
        env(&[("USER", "root")]),
    ));
    let err = c.security().unwrap_err().to_string();
    assert!(
        err.contains("/nonexistent/ssl/certs/root.mcollective.pem"),
        "{err}"
    );

    // Insecure mode is the file provider with its own keys, not the puppet files.
    let mut c = ChoriaConfig::parse_str(
        "plugin.security.provider = puppet\nplugin.choria.ssldir = /p/ssl\n",
    )
    .unwrap();
    c.apply_provisioner_overrides(&ProvisionerOverrides {
        insecure: true,
        ..Default::default()
    });
    assert_eq!(c.security_provider, SecurityProvider::File);
    assert!(c.puppet.is_none());
    assert_eq!(c.file_certificate, None);
    assert_eq!(c.file_key, None);
    assert_eq!(c.file_ca, None);
}

/// An environment of `vars` only.
fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[test]
fn puppet_certname_and_ssldir_follow_go_choria_for_a_client() {
    let ssldir = Path::new("/srv/ssl");
    // (ssldir setting, root, environment) -> (ssldir, its source, certname, its source)
    type Case<'a> = (
        Option<&'a Path>,
        bool,
        Vec<(&'a str, &'a str)>,
        &'a str,
        SslDirSource,
        &'a str,
        CertnameSource,
    );
    let cases: Vec<Case> = vec![
        (
            None,
            true,
            vec![("USER", "root")],
            PUPPET_ROOT_SSLDIR,
            SslDirSource::RootDefault,
            "root.mcollective",
            CertnameSource::User,
        ),
        (
            None,
            true,
            vec![
                ("USER", "root"),
                ("MCOLLECTIVE_CERTNAME", "prov.example.net"),
            ],
            PUPPET_ROOT_SSLDIR,
            SslDirSource::RootDefault,
            "prov.example.net",
            CertnameSource::Environment,
        ),
        (
            None,
            false,
            vec![("USER", "choria"), ("HOME", "/home/choria")],
            "/home/choria/.puppetlabs/etc/puppet/ssl",
            SslDirSource::UserDefault,
            "choria.mcollective",
            CertnameSource::User,
        ),
        (
            Some(ssldir),
            false,
            vec![("USER", "choria")],
            "/srv/ssl",
            SslDirSource::Setting,
            "choria.mcollective",
            CertnameSource::User,
        ),
        (
            Some(ssldir),
            true,
            vec![("USER", ""), ("MCOLLECTIVE_CERTNAME", "p1")],
            "/srv/ssl",
            SslDirSource::Setting,
            "p1",
            CertnameSource::Environment,
        ),
        (
            Some(ssldir),
            true,
            vec![("USER", "root"), ("MCOLLECTIVE_CERTNAME", "")],
            "/srv/ssl",
            SslDirSource::Setting,
            "root.mcollective",
            CertnameSource::User,
        ),
    ];
    for (setting, root, vars, want_dir, dir_from, want_cn, cn_from) in cases {
        let p = PuppetSettings::resolve(setting, root, env(&vars))
            .unwrap_or_else(|e| panic!("{vars:?}: {e}"));
        assert_eq!(p.ssldir, Path::new(want_dir), "{vars:?}");
        assert_eq!(p.ssldir_from, dir_from, "{vars:?}");
        assert_eq!(p.certname, want_cn, "{vars:?}");
        assert_eq!(p.certname_from, cn_from, "{vars:?}");
        assert_eq!(
            p.certificate(),
            Path::new(want_dir).join(format!("certs/{want_cn}.pem"))
        );
        assert_eq!(
            p.key(),
            Path::new(want_dir).join(format!("private_keys/{want_cn}.pem"))
        );
        assert_eq!(p.ca(), Path::new(want_dir).join("certs/ca.pem"));
    }

    for vars in [vec![], vec![("USER", "")], vec![("HOME", "/root")]] {
        assert_eq!(
            PuppetSettings::resolve(None, true, env(&vars)),
            Err(PuppetError::NoCertname),
            "{vars:?}"
        );
    }
    let e = PuppetSettings::resolve(None, true, env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("MCOLLECTIVE_CERTNAME") && e.contains("USER"),
        "{e}"
    );
    assert_eq!(
        PuppetSettings::resolve(None, false, env(&[("USER", "u"), ("HOME", "")])),
        Err(PuppetError::NoHome)
    );
    let e = PuppetError::NoHome.to_string();
    assert!(e.contains("plugin.choria.ssldir"), "{e}");
    for bad in ["../../etc/x", "a/b", "..", ".", "a\0b"] {
        let r = PuppetSettings::resolve(Some(ssldir), true, env(&[("MCOLLECTIVE_CERTNAME", bad)]));
        assert!(
            matches!(
                r,
                Err(PuppetError::InvalidCertname {
                    from: CertnameSource::Environment,
                    ..
                })
            ),
            "{bad:?}: {r:?}"
        );
    }
    let r = PuppetSettings::resolve(Some(ssldir), true, env(&[("USER", "x/y")]));
    assert!(
        matches!(
            r,
            Err(PuppetError::InvalidCertname {
                from: CertnameSource::User,
                ..
            })
        ),
        "{r:?}"
    );
    // A hostile name is escaped and bounded in the message.
    let long = format!("a/\u{1b}[31m{}", "x".repeat(5000));
    let e = PuppetSettings::resolve(Some(ssldir), true, env(&[("MCOLLECTIVE_CERTNAME", &long)]))
        .unwrap_err()
        .to_string();
    assert!(e.len() < 600 && !e.contains('\u{1b}'), "{e}");
}

#[test]
fn the_file_provider_certname_follows_go_choria() {
    let e = env(&[("USER", "alice")]);
    assert_eq!(
        file_certname("id.example.net", false, &e),
        "alice.mcollective"
    );
    assert_eq!(file_certname("id.example.net", true, &e), "id.example.net");
    assert_eq!(
        file_certname("id.example.net", false, env(&[])),
        "id.example.net"
    );
    let e = env(&[("USER", "alice"), ("MCOLLECTIVE_CERTNAME", "c1")]);
    assert_eq!(file_certname("id.example.net", true, &e), "c1");
    assert_eq!(file_certname("id.example.net", false, &e), "c1");
}

#[test]
fn providers_are_named_in_words_and_unsupported_ones_say_what_to_use() {
    for name in ["file", "choria", "puppet", "pkcs11", "certmanager", "vault"] {
        let p = SecurityProvider::from_name(name);
        assert_eq!(p.to_string(), name);
        assert_eq!(p.name(), name);
    }
    assert_eq!(
        SecurityProvider::from_name("vault"),
        SecurityProvider::Other("vault".into())
    );
    for ok in ["file", "choria", "puppet"] {
        assert!(
            SecurityProvider::from_name(ok).unsupported().is_none(),
            "{ok}"
        );
    }
    for (name, wants) in [
        (
            "pkcs11",
            vec![
                "pkcs11",
                "plugin.security.provider = file",
                "plugin.security.file.key",
            ],
        ),
        (
            "certmanager",
            vec![
                "certmanager",
                "plugin.security.provider",
                "= file",
                "plugin.security.file.certificate",
            ],
        ),
        (
            "vault",
            vec!["vault", "puppet (the default), file and choria"],
        ),
    ] {
        let c = ChoriaConfig::parse_str(&format!("plugin.security.provider = {name}\n")).unwrap();
        let e = c.security().unwrap_err().to_string();
        for want in wants {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        assert!(!e.contains("Other("), "{e}");
    }
    // A name with control characters is escaped in words, and bounded.
    let p = SecurityProvider::from_name(&format!("x\u{7}{}", "y".repeat(400)));
    let text = p.unsupported().unwrap().to_string();
    assert!(!text.contains('\u{7}') && text.len() < 400, "{text}");
}

#[test]
fn the_puppet_provider_signs_with_the_files_in_its_ssldir() {
    let dir = tempfile::tempdir().unwrap();
    let ssl = dir.path().join("ssl");
    std::fs::create_dir_all(ssl.join("certs")).unwrap();
    std::fs::create_dir_all(ssl.join("private_keys")).unwrap();
    let tls = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/tls");
    std::fs::copy(
        format!("{tls}/provisioner.pem"),
        ssl.join("certs/prov.mcollective.pem"),
    )
    .unwrap();
    std::fs::copy(format!("{tls}/ca.pem"), ssl.join("certs/ca.pem")).unwrap();
    let mut c = ChoriaConfig::parse_str(&format!(
        "identity = p1\nplugin.choria.ssldir = {}\n",
        ssl.display()
    ))
    .unwrap();
    assert_eq!(c.security_provider, SecurityProvider::Puppet);
    let p = PuppetSettings::resolve(
        Some(&ssl),
        true,
        env(&[("MCOLLECTIVE_CERTNAME", "prov.mcollective")]),
    )
    .unwrap();
    c.puppet = Some(Ok(p.clone()));
    // The key is missing: the error names it with its full path.
    let e = c.security().unwrap_err().to_string();
    assert!(e.contains(&p.key().display().to_string()), "{e}");
    std::fs::copy(format!("{tls}/provisioner_key.pem"), p.key()).unwrap();
    let sec = c.security().unwrap();
    assert_eq!(sec.caller_id(), "choria=prov.mcollective");
    assert_eq!(sec.version(), crate::protocol::ProtocolVersion::V1);
    match &sec {
        Security::X509 { cert_pem, .. } => {
            assert_eq!(cert_pem, &std::fs::read_to_string(p.certificate()).unwrap())
        }
        other => panic!("not x509: {other:?}"),
    }
    assert_eq!(c.caller_certname().as_deref(), Some("prov.mcollective"));
    c.puppet = Some(Err(PuppetError::NoCertname));
    assert_eq!(c.caller_certname(), None);
    assert!(matches!(
        c.security(),
        Err(ChoriaConfigError::Puppet(PuppetError::NoCertname))
    ));
}

#[test]
fn middleware_host_table() {
    for (input, want) in [
        ("h:4222", Some("nats://h:4222")),
        ("nats://h:1", Some("nats://h:1")),
        ("tls://10.0.0.1:4443", Some("tls://10.0.0.1:4443")),
        ("h", None),
        ("h:port", None),
        (":4222", None),
        ("://h:4222", None),
    ] {
        assert_eq!(
            parse_middleware_host(input).ok().as_deref(),
            want,
            "{input}"
        );
    }
}

#[test]
fn booleans_and_durations() {
    for t in ["1", "yes", "TRUE", "y", "t"] {
        assert!(parse_bool(t));
    }
    for f in ["0", "no", "false", "n", "f", "maybe"] {
        assert!(!parse_bool(f));
    }
}

#[test]
fn missing_security_files_are_reported_by_key() {
    let c = ChoriaConfig::parse_str("plugin.security.provider = file").unwrap();
    assert!(matches!(
        c.security(),
        Err(ChoriaConfigError::MissingSetting {
            key: "plugin.security.file.certificate",
            ..
        })
    ));
    let c = ChoriaConfig::parse_str(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = /nonexistent/t\nplugin.security.choria.seed_file = /nonexistent/s",
        )
        .unwrap();
    assert!(matches!(c.security(), Err(ChoriaConfigError::Security(_))));
}

#[test]
fn file_provider_loads_real_files() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let c = ChoriaConfig::parse_str(&format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {dir}/testdata/x509_cert.pem\nplugin.security.file.key = {dir}/testdata/x509_key.pem\n"
        ))
        .unwrap();
    let sec = c.security().unwrap();
    assert!(matches!(sec, Security::X509 { .. }));
    let c = ChoriaConfig::parse_str(&format!(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = {dir}/testdata/v2_caller.jwt\nplugin.security.choria.seed_file = {dir}/testdata/v2_seed.hex\n"
        ))
        .unwrap();
    let sec = c.security().unwrap();
    assert_eq!(sec.caller_id(), "provisioner_signer");
}
