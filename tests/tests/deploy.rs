//! The shipped deployment files are valid: the systemd unit passes `systemd-analyze
//! verify`, the Slurm scripts are valid shell.

use std::process::Command;

use commtap_tests::*;

#[test]
fn systemd_unit_verifies() {
    let scratch = Scratch::new("deploy");
    let unit = std::fs::read_to_string(repo_root().join("deploy/systemd/commtap.service"))
        .expect("unit file");
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let unit = unit.replace(
        "/usr/local/bin/commtap",
        commtap_bin().to_str().expect("utf8"),
    );
    let path = scratch.path("commtap.service");
    std::fs::write(&path, unit).expect("writing the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("running systemd-analyze");
    let msgs = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !msgs.contains("commtap.service:"),
        "systemd-analyze verify:\n{msgs}"
    );
}

#[test]
fn slurm_scripts_are_valid_shell() {
    for script in ["prolog.sh", "epilog.sh"] {
        let path = repo_root().join("deploy/slurm").join(script);
        let out = Command::new("sh")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("running sh -n");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
