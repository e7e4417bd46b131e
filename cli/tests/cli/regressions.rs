//! The reliability regression corpus (`tests/regressions/`, issue 15): every reproducer of a
//! crash, an unbounded allocation, an escape or a lost file, run as the user ran it — under an
//! address-space limit and a time limit, with its peak memory measured — and each must give a
//! clean error or the right result. The cases and their format are in
//! `tests/regressions/cases.txt`; inputs too big to commit are generated here.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The corpus directory.
fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/regressions")
}

/// What a case expects.
#[derive(Debug)]
enum Expect {
    Ok(Option<String>),
    Error(String),
    Intact(PathBuf),
    NoTemp(PathBuf),
}

#[derive(Debug)]
struct Case {
    name: String,
    line: usize,
    argv: Vec<String>,
    expect: Expect,
    mem: u64,
    time: Duration,
    rss: Option<u64>,
    fsize: Option<u64>,
    stdout_closed: bool,
    env: Vec<(String, String)>,
}

/// `64M`, `4G`, `16K` or plain bytes.
fn size(s: &str) -> u64 {
    let (n, m) = match s.as_bytes().last() {
        Some(b'K') => (&s[..s.len() - 1], 1 << 10),
        Some(b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().unwrap_or_else(|_| panic!("bad size `{s}`")) * m
}

fn parse(text: &str, dir: &Path, tmp: &Path) -> Vec<Case> {
    let subst = |s: &str| {
        s.replace("{dir}", dir.to_str().unwrap())
            .replace("{root}", dir.join("../..").to_str().unwrap())
            .replace("{tmp}", tmp.to_str().unwrap())
    };
    let mut cases = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(
            fields.len() >= 3,
            "cases.txt:{}: NAME | COMMAND | EXPECT [| OPTIONS]",
            i + 1
        );
        let argv: Vec<String> = fields[1].split_whitespace().map(subst).collect();
        let expect = match fields[2].split_once(':') {
            None if fields[2] == "ok" => Expect::Ok(None),
            Some(("ok", t)) => Expect::Ok(Some(t.trim().to_string())),
            Some(("error", t)) => Expect::Error(t.trim().to_string()),
            Some(("intact", p)) => Expect::Intact(subst(p.trim()).into()),
            Some(("no-temp", p)) => Expect::NoTemp(subst(p.trim()).into()),
            _ => panic!("cases.txt:{}: unknown expectation `{}`", i + 1, fields[2]),
        };
        let mut case = Case {
            name: fields[0].to_string(),
            line: i + 1,
            argv,
            expect,
            mem: 4 << 30,
            time: Duration::from_secs(120),
            rss: None,
            fsize: None,
            stdout_closed: false,
            env: Vec::new(),
        };
        for opt in fields.get(3).map_or("", |o| *o).split_whitespace() {
            match opt.split_once('=') {
                Some(("mem", v)) => case.mem = size(v),
                Some(("time", v)) => case.time = Duration::from_secs(v.parse().unwrap()),
                Some(("rss", v)) => case.rss = Some(size(v)),
                Some(("fsize", v)) => case.fsize = Some(size(v)),
                Some(("stdout", "closed")) => case.stdout_closed = true,
                Some(("env", kv)) => {
                    let (k, v) = kv.split_once('=').expect("env=NAME=VALUE");
                    case.env.push((k.to_string(), v.to_string()));
                }
                _ => panic!("cases.txt:{}: unknown option `{opt}`", i + 1),
            }
        }
        cases.push(case);
    }
    cases
}

/// The inputs too big (or too odd: symlinks, a FIFO) to commit.
fn prepare(dir: &Path, tmp: &Path) {
    // 01: 30,000 chained negs (the cpu backend overflowed its stack at 15–20k).
    let n = 30_000;
    let mut text = String::from("graph @g {\n  %x = input \"x\" : f32[4]\n  %v1 = neg(%x) : f32[4]\n");
    for i in 2..=n {
        text.push_str(&format!("  %v{i} = neg(%v{}) : f32[4]\n", i - 1));
    }
    text.push_str(&format!("  output \"y\" = %v{n}\n}}\n"));
    std::fs::write(tmp.join("chain30000.oir"), text).unwrap();
    // 04: external data through a symlinked file and a symlinked directory.
    let src = dir.join("04_onnx_symlink_escape");
    let dst = tmp.join("04");
    std::fs::create_dir_all(dst.join("dir_variant")).unwrap();
    std::fs::copy(src.join("m.onnx"), dst.join("m.onnx")).unwrap();
    std::fs::copy(src.join("dir_variant/m.onnx"), dst.join("dir_variant/m.onnx")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dst.join("link.bin")).unwrap();
    std::os::unix::fs::symlink("/etc", dst.join("dir_variant/d")).unwrap();
    // 09: a FIFO given as an input must not block.
    let fifo = std::ffi::CString::new(tmp.join("fifo.npy").to_str().unwrap()).unwrap();
    // Safety: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::fs::create_dir_all(tmp.join("w")).unwrap();
}

/// How a case's process ended.
struct Ended {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    max_rss: u64,
    elapsed: Duration,
    timed_out: bool,
}

/// Run a case's command under its limits; wait with `wait4` to read its peak RSS.
fn launch(c: &Case) -> Ended {
    let program = if c.argv[0] == "oar" {
        env!("CARGO_BIN_EXE_oar").to_string()
    } else {
        c.argv[0].clone()
    };
    let mut cmd = Command::new(program);
    cmd.args(&c.argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &c.env {
        cmd.env(k, v);
    }
    let (mem, fsize) = (c.mem, c.fsize);
    // Safety: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = |r, v: u64| {
                let l = libc::rlimit {
                    rlim_cur: v as libc::rlim_t,
                    rlim_max: v as libc::rlim_t,
                };
                if libc::setrlimit(r, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            };
            lim(libc::RLIMIT_AS, mem)?;
            if let Some(f) = fsize {
                lim(libc::RLIMIT_FSIZE, f)?;
            }
            Ok(())
        });
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{}: cannot start {:?}: {e}", c.name, c.argv));
    let pid = child.id() as libc::pid_t;
    let mut out_pipe = child.stdout.take().unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let stdout_closed = c.stdout_closed;
    let out_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if stdout_closed {
            drop(out_pipe);
        } else {
            let _ = out_pipe.read_to_end(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err_pipe.read_to_end(&mut s);
        s
    });
    let mut status = 0;
    // Safety: a zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // Safety: `pid` is our child, not yet reaped (std never waits for it: we do).
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert!(r == 0, "{}: wait4 failed", c.name);
        if start.elapsed() > c.time {
            timed_out = true;
            // Safety: as above; the child is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
    drop(child);
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else {
        (None, Some(libc::WTERMSIG(status)))
    };
    Ended {
        code,
        signal,
        stdout,
        stderr,
        max_rss: usage.ru_maxrss as u64 * 1024,
        elapsed,
        timed_out,
    }
}

/// Check one case; the failures as text.
fn check(c: &Case) -> Vec<String> {
    let before = match &c.expect {
        Expect::Intact(p) => Some(std::fs::read(p).unwrap_or_else(|e| panic!("{}: {}: {e}", c.name, p.display()))),
        _ => None,
    };
    let e = launch(c);
    let mut bad = Vec::new();
    if e.timed_out {
        bad.push(format!("timed out after {:?}", c.time));
    }
    let allowed_signal = match e.signal {
        None => true,
        Some(s) => (c.fsize.is_some() && s == libc::SIGXFSZ) || (c.stdout_closed && s == libc::SIGPIPE),
    };
    if !allowed_signal {
        bad.push(format!("killed by signal {}", e.signal.unwrap()));
    }
    for bad_word in [
        "panicked",
        "overflowed its stack",
        "memory allocation of",
        "internal error",
        "RUST_BACKTRACE",
    ] {
        if e.stderr.contains(bad_word) {
            bad.push(format!("stderr mentions `{bad_word}`"));
        }
    }
    if let Some(cap) = c.rss
        && e.max_rss > cap
    {
        bad.push(format!(
            "peak RSS {} MiB over the {} MiB cap",
            e.max_rss >> 20,
            cap >> 20
        ));
    }
    match &c.expect {
        Expect::Ok(text) => {
            if e.code != Some(0) && !(c.stdout_closed && e.signal == Some(libc::SIGPIPE)) {
                bad.push(format!("expected success, got {:?}/{:?}", e.code, e.signal));
            }
            if let Some(t) = text
                && !e.stdout.contains(t.as_str())
            {
                bad.push(format!("stdout lacks {t:?}: {:?}", preview(&e.stdout)));
            }
        }
        Expect::Error(t) => {
            if !matches!(e.code, Some(1 | 2)) {
                bad.push(format!(
                    "expected a clean failure (exit 1 or 2), got {:?}/{:?}",
                    e.code, e.signal
                ));
            }
            let first = e.stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            if !first.starts_with("error") || !e.stderr.contains(t.as_str()) {
                bad.push(format!("stderr should be `error: …{t}…`"));
            }
        }
        Expect::Intact(p) => {
            if std::fs::read(p).ok() != before {
                bad.push(format!("{} changed", p.display()));
            }
        }
        Expect::NoTemp(p) => {
            if e.code != Some(0) {
                bad.push(format!("expected success, got {:?}/{:?}", e.code, e.signal));
            }
            let name = p.file_name().unwrap().to_str().unwrap();
            let prefix = format!(".{name}.");
            for f in std::fs::read_dir(p.parent().unwrap()).unwrap().flatten() {
                let f = f.file_name().to_string_lossy().into_owned();
                if f.starts_with(&prefix) && f.ends_with(".tmp") {
                    bad.push(format!("temp file {f} left beside {}", p.display()));
                }
            }
        }
    }
    if !bad.is_empty() {
        bad.insert(
            0,
            format!(
                "{} (cases.txt:{}, {:.1} s, peak RSS {} MiB): {}",
                c.name,
                c.line,
                e.elapsed.as_secs_f64(),
                e.max_rss >> 20,
                c.argv.join(" ")
            ),
        );
        bad.push(format!("stderr: {}", preview(&e.stderr)));
    }
    bad
}

fn preview(s: &str) -> String {
    s.chars().take(400).collect()
}

/// Every case of the corpus, in order. `OAR_REGRESSIONS=NAME,…` runs only those (and is
/// meant for debugging one case: later cases may need earlier ones' files).
#[test]
fn reliability_regression_corpus() {
    let dir = corpus();
    let tmp = tempfile::tempdir().unwrap();
    prepare(&dir, tmp.path());
    let text = std::fs::read_to_string(dir.join("cases.txt")).unwrap();
    let cases = parse(&text, &dir, tmp.path());
    assert!(cases.len() > 50, "the corpus lost its cases");
    let only: Option<Vec<String>> = std::env::var("OAR_REGRESSIONS")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let mut failures = Vec::new();
    for c in &cases {
        if only.as_ref().is_some_and(|o| !o.contains(&c.name)) {
            continue;
        }
        failures.extend(check(c));
    }
    assert!(
        failures.is_empty(),
        "regression corpus failures:\n{}",
        failures.join("\n")
    );
}
