//! Runs a doc's marked blocks in one bash session, as a reader pastes them into one terminal.
//! The marker and what each attribute does: `walkthroughs.rs`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long one step, or waiting for a background program's line, may take.
const STEP: Duration = Duration::from_secs(120);

/// Marks the end of a step's output; the step's exit status follows it.
const DONE: &str = "@@walkthrough-step-done";

/// One fenced block of a walk-through.
#[derive(Debug)]
pub struct Block {
    /// The doc and line of the opening fence, for messages.
    pub at: String,
    /// The language word of the info string (`sh`, `python`, `text`).
    pub lang: String,
    /// `background=NAME`.
    pub background: Option<String>,
    /// `output` (`Some(None)`: the step before) or `output=NAME` (a background program).
    pub output: Option<Option<String>>,
    /// The block's lines.
    pub text: String,
}

/// The blocks of `doc` (a path from the repository root) marked `walkthrough=name`, in order.
pub fn blocks(doc: &str, name: &str) -> Vec<Block> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(doc);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let mut words = info.split_whitespace();
        let lang = words.next().unwrap_or_default().to_string();
        let attrs: HashMap<&str, Option<&str>> = words
            .map(|w| match w.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (w, None),
            })
            .collect();
        let mut body = Vec::new();
        for (_, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            body.push(l.get(indent..).unwrap_or(l.trim_start()));
        }
        if attrs.get("walkthrough") != Some(&Some(name)) {
            continue;
        }
        for k in attrs.keys() {
            assert!(
                ["walkthrough", "background", "output"].contains(k),
                "{doc}:{}: unknown walk-through attribute {k}",
                n + 1
            );
        }
        out.push(Block {
            at: format!("{doc}:{}", n + 1),
            lang,
            background: attrs.get("background").map(|v| {
                v.unwrap_or_else(|| panic!("{doc}:{}: background=NAME", n + 1))
                    .to_string()
            }),
            output: attrs.get("output").map(|v| v.map(str::to_string)),
            text: body.join("\n") + "\n",
        });
    }
    assert!(
        !out.is_empty(),
        "{doc} has no block marked walkthrough={name}"
    );
    out
}

/// Whether `expected` (one line of an output block; `…` matches anything) is in `line`.
fn line_matches(line: &str, expected: &str) -> bool {
    let mut rest = line;
    for part in expected.split('…') {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// Whether every line of `expected` matches a line of `output`, in order.
fn output_matches(output: &str, expected: &str) -> bool {
    let mut lines = output.lines();
    expected
        .lines()
        .filter(|l| !l.trim().is_empty())
        .all(|e| lines.any(|l| line_matches(l, e.trim())))
}

/// A bash session in a scratch directory, with the repository's `tests` and `scripts` linked
/// in (docs name them from the repository root), and shims so the docs' commands run what the
/// tests built: `cargo run --release` (and `target/release/gridlet`) is this build's `gridlet`,
/// `cargo run --example subscriber` the sample subscriber (compiled here with `rustc`). `gridlet`
/// is on the `PATH`, and so is the Python virtualenv `scripts/test.sh` makes (`python3` has the
/// Azure SDK and `opentelemetry-proto`); its npm packages are the session's `node_modules`.
pub struct Session {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pub dir: tempfile::TempDir,
    step: usize,
    last_output: String,
}

fn python_bin() -> PathBuf {
    let python = std::env::var("GRIDLET_OTEL_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/gridlet/otel-py/bin/python")
    });
    PathBuf::from(python)
        .parent()
        .expect("the interpreter's directory")
        .to_path_buf()
}

/// `node_modules` of the npm packages `scripts/test.sh` installs (`@azure/eventgrid-namespaces`).
fn js_modules() -> PathBuf {
    let dir = std::env::var("GRIDLET_EVENTGRID_JS").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/gridlet/eventgrid-js")
    });
    PathBuf::from(dir).join("node_modules")
}

impl Session {
    /// Start bash with `env` exported (the ports and the variables the doc lets the test set).
    pub fn start(env: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for d in ["tests", "scripts"] {
            std::os::unix::fs::symlink(root.join(d), dir.path().join(d)).unwrap();
        }
        // The npm packages `scripts/test.sh` installs, where an ES module in the session finds
        // them.
        std::os::unix::fs::symlink(js_modules(), dir.path().join("node_modules")).unwrap();
        let subscriber = dir.path().join(".bin/subscriber");
        std::fs::create_dir_all(subscriber.parent().unwrap()).unwrap();
        let rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
            .args(["--edition", "2021", "-o"])
            .arg(&subscriber)
            .arg(root.join("examples/subscriber/main.rs"))
            .status()
            .expect("rustc runs");
        assert!(rustc.success(), "the sample subscriber does not compile");
        let gridlet = PathBuf::from(env!("CARGO_BIN_EXE_gridlet"));
        // `target/release/gridlet`, as the docs name the binary `cargo run --release` built.
        let release = dir.path().join("target/release");
        std::fs::create_dir_all(&release).unwrap();
        std::os::unix::fs::symlink(&gridlet, release.join("gridlet")).unwrap();
        let path = format!(
            "{}:{}:{}",
            gridlet.parent().unwrap().display(),
            python_bin().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new("bash")
            .args(["--noprofile", "--norc", "-s"])
            .current_dir(dir.path())
            .env("PATH", path)
            .env("GRIDLET_BIN", &gridlet)
            .env("SUBSCRIBER_BIN", &subscriber)
            .env("inbound__bindAddress", "127.0.0.1")
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own process group, so that everything it starts is ended with it.
            .process_group(0)
            .spawn()
            .expect("bash runs");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut s = Self {
            child,
            stdin,
            lines,
            dir,
            step: 0,
            last_output: String::new(),
        };
        s.send(
            r#"exec 2>&1
cargo() {
  case "$*" in
    "run --release"|run) "$GRIDLET_BIN" ;;
    "run --example subscriber") "$SUBSCRIBER_BIN" ;;
    *) echo "walkthrough: the tests do not run cargo $*"; return 127 ;;
  esac
}
"#,
        );
        s
    }

    fn send(&mut self, text: &str) {
        self.stdin.write_all(text.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Run `script` in the session; its output (stdout and stderr) and exit status.
    pub fn run(&mut self, script: &str) -> (String, i32) {
        self.step += 1;
        let script =
            format!("{{\n{script}\n}} < /dev/null\n__st=$?; echo; echo \"{DONE} $__st\"\n");
        self.send(&script);
        let deadline = Instant::now() + STEP;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => match l.strip_prefix(DONE) {
                    Some(status) => {
                        if out.last().is_some_and(|l: &String| l.is_empty()) {
                            out.pop();
                        }
                        return (out.join("\n"), status.trim().parse().unwrap_or(-1));
                    }
                    None => out.push(l),
                },
                Err(_) => panic!(
                    "step {} did not finish within {STEP:?}; output so far:\n{}",
                    self.step,
                    out.join("\n")
                ),
            }
        }
    }

    /// The log of the background program `name` so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!(".bin/{name}.log")))
            .unwrap_or_default()
    }

    /// Wait until the background program `name`'s log matches `expected`.
    pub fn wait_log(&self, name: &str, expected: &str, at: &str) {
        let deadline = Instant::now() + STEP;
        while !output_matches(&self.log(name), expected) {
            assert!(
                Instant::now() < deadline,
                "{at}: {name} never printed\n{expected}\nits log:\n{}",
                self.log(name)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Start `script` in the background as `name` (its output is `name`'s log).
    pub fn background(&mut self, name: &str, script: &str, at: &str) {
        let (out, _) = self.run(&format!(
            "{{\n{script}\n}} < /dev/null > .bin/{name}.log 2>&1 &"
        ));
        assert!(out.is_empty(), "{at}: {out}");
    }

    /// Run one block: a background program, a step, or an output block checked against the
    /// step before it or a background program's log. A step must exit 0 and, unless the next
    /// block says what it prints (`checked_next`), print no error body.
    pub fn block(&mut self, b: &Block, checked_next: bool) {
        if let Some(expected) = &b.output {
            match expected {
                None => assert!(
                    output_matches(&self.last_output, &b.text),
                    "{}: the step before printed\n{}\nnot\n{}",
                    b.at,
                    self.last_output,
                    b.text
                ),
                Some(name) => self.wait_log(name, &b.text, &b.at),
            }
            return;
        }
        let script = match b.lang.as_str() {
            "sh" | "bash" | "console" => b.text.clone(),
            "python" | "py" => {
                let file = format!(".bin/step-{}.py", self.step + 1);
                std::fs::write(self.dir.path().join(&file), &b.text).unwrap();
                format!("python3 {file}")
            }
            "js" | "javascript" => {
                let file = format!(".bin/step-{}.mjs", self.step + 1);
                std::fs::write(self.dir.path().join(&file), &b.text).unwrap();
                format!("node {file}")
            }
            other => panic!("{}: cannot run a {other} block", b.at),
        };
        if let Some(name) = &b.background {
            self.background(name, &script, &b.at);
            return;
        }
        let (out, status) = self.run(&script);
        assert_eq!(status, 0, "{}: exit status {status}; output:\n{out}", b.at);
        assert!(
            checked_next || !out.contains("{\"error\":"),
            "{}: an error answer:\n{out}",
            b.at
        );
        self.last_output = out;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // bash and what it started (the broker, the receivers) share its process group.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

#[test]
fn output_lines_match_in_order_with_ellipses() {
    let out = "a\n{\"topic\":\"t1\",\"id\":\"1\"}\nb";
    assert!(output_matches(out, "{\"topic\":\"t1\",…\"id\":\"1\"…"));
    assert!(output_matches(out, "a\nb"));
    assert!(!output_matches(out, "b\na"));
    assert!(!output_matches(out, "zzz"));
}
