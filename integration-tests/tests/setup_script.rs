//! `scripts/setup.sh` decides what to install from the package state that `dpkg-query` reports,
//! never from a file glob: a new machine ships LLVM's `libclang-cpp14`, which is no libclang for
//! bindgen. Each test runs the script against a made-up package state: stand-ins for
//! `dpkg-query`, `apt-get` and `id` come first on `PATH`, and the `apt-get` stand-in records
//! what it was asked to install.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A folder of stand-in commands over a package state (`name status` lines, status as dpkg's
/// `${db:Status-Status}`: `installed`, `config-files`, ...).
struct FakeMachine {
    dir: PathBuf,
}

impl FakeMachine {
    fn new(name: &str, packages: &[(&str, &str)], uid: u32) -> FakeMachine {
        let dir = std::env::temp_dir().join(format!("bx-setup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let state: String = packages.iter().map(|(p, s)| format!("{p} {s}\n")).collect();
        std::fs::write(dir.join("state"), state).unwrap();
        // dpkg-query -W -f=FORMAT PATTERN: one line per known package matching PATTERN (a
        // name or a glob), FORMAT's ${db:Status-Status} and ${Package} filled in; no match is
        // an error, as dpkg-query's "no packages found matching".
        let dpkg_query = format!(
            r#"#!/bin/bash
fmt=; pat=
for a in "$@"; do case "$a" in -W) ;; -f=*) fmt=${{a#-f=}} ;; *) pat=$a ;; esac; done
found=0
while read -r p s; do
  if [[ $p == $pat ]]; then
    found=1
    out=${{fmt//'${{db:Status-Status}}'/$s}}
    out=${{out//'${{Package}}'/$p}}
    printf "$out"
  fi
done < '{state}'
[ $found = 1 ] || {{ echo "dpkg-query: no packages found matching $pat" >&2; exit 1; }}
"#,
            state = dir.join("state").display()
        );
        let apt_get = format!(
            "#!/bin/bash\necho \"$*\" >> '{}'\n",
            dir.join("apt.log").display()
        );
        let id = format!("#!/bin/bash\n[ \"$1\" = -u ] && echo {uid}\n");
        for (name, text) in [("dpkg-query", dpkg_query), ("apt-get", apt_get), ("id", id)] {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            let _ = Command::new("chmod").arg("+x").arg(&path).status();
        }
        FakeMachine { dir }
    }

    /// Runs the setup script with the stand-ins first on `PATH`.
    fn run_setup(&self) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup.sh");
        Command::new("bash")
            .arg(script)
            .env("PATH", format!("{}:/usr/bin:/bin", self.dir.display()))
            .output()
            .expect("running scripts/setup.sh")
    }

    /// The `apt-get` calls the script made, one per line.
    fn apt_calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("apt.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for FakeMachine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The packages of the `apt-get install` call, if there was one.
fn installed_by(calls: &[String]) -> Option<Vec<String>> {
    calls.iter().find(|c| c.contains("install")).map(|c| {
        c.split_whitespace()
            .filter(|w| !w.starts_with('-') && *w != "install")
            .map(str::to_owned)
            .collect()
    })
}

#[test]
fn a_machine_with_only_libclang_cpp_gets_libclang_dev() {
    let m = FakeMachine::new(
        "cpp-only",
        &[
            ("libclang-cpp14", "installed"),
            ("libllvm14", "installed"),
            ("llvm-14-dev", "installed"),
            ("cmake", "installed"),
            ("python3-venv", "installed"),
        ],
        0,
    );
    let out = m.run_setup();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "setup failed: {stderr}");
    let calls = m.apt_calls();
    assert_eq!(
        installed_by(&calls),
        Some(vec!["libclang-dev".to_string()]),
        "apt-get calls: {calls:?}"
    );
    assert!(calls.iter().any(|c| c.contains("update")), "{calls:?}");
    assert!(
        stderr.contains("installing libclang-dev"),
        "says what it installs: {stderr}"
    );
}

#[test]
fn a_machine_with_every_package_installs_nothing_and_says_so() {
    let m = FakeMachine::new(
        "complete",
        &[
            ("libclang-cpp14", "installed"),
            ("libclang-dev", "installed"),
            ("cmake", "installed"),
            ("python3-venv", "installed"),
        ],
        0,
    );
    let out = m.run_setup();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "setup failed: {stderr}");
    assert_eq!(m.apt_calls(), Vec::<String>::new());
    assert!(stderr.contains("present"), "{stderr}");
}

#[test]
fn a_versioned_libclang_dev_counts_as_libclang_dev() {
    let m = FakeMachine::new(
        "versioned",
        &[
            ("libclang-15-dev", "installed"),
            ("cmake", "installed"),
            ("python3-venv", "installed"),
        ],
        0,
    );
    let out = m.run_setup();
    assert!(out.status.success());
    assert_eq!(m.apt_calls(), Vec::<String>::new());
}

#[test]
fn removed_packages_with_configuration_left_are_installed_again() {
    let m = FakeMachine::new(
        "removed",
        &[
            ("libclang-dev", "config-files"),
            ("libclang-14-dev", "config-files"),
            ("cmake", "config-files"),
            ("python3-venv", "installed"),
        ],
        0,
    );
    let out = m.run_setup();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        installed_by(&m.apt_calls()),
        Some(vec!["cmake".to_string(), "libclang-dev".to_string()])
    );
}

#[test]
fn without_root_it_names_the_missing_packages_and_fails() {
    let m = FakeMachine::new(
        "non-root",
        &[("libclang-cpp14", "installed"), ("cmake", "installed")],
        1000,
    );
    let out = m.run_setup();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("libclang-dev") && stderr.contains("python3-venv"),
        "{stderr}"
    );
    assert_eq!(m.apt_calls(), Vec::<String>::new());
}
