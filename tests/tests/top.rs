//! `commtap top` in a real terminal (tmux, installed by setup) against a daemon watching a
//! real Open MPI job (`mpi_loop`, held after its counted calls): the job's routines appear
//! with the truth's call counts, `s` sorts, `r` and `j` filter (the counts become one
//! rank's), `p` pauses, the screen follows a resize, and `q` quits with the terminal given
//! back; while a job runs, its rates move.

use std::{path::PathBuf, process::Command, time::Duration};

use commtap_tests::*;

const LIMIT: Duration = Duration::from_mins(2);
/// The loop's iterations.
const N: u64 = 500;

/// A tmux server of the test's own (its socket under the scratch directory).
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket).args(["-f", "/dev/null"]);
        c
    }

    #[track_caller]
    fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("running tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts session `name` (150 x 45) running `command`.
    #[track_caller]
    fn session(&self, name: &str, command: &[String]) {
        let mut args = vec!["new-session", "-d", "-s", name, "-x", "150", "-y", "45"];
        args.extend(command.iter().map(String::as_str));
        self.run(&args);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    fn pane(&self, format: &str) -> String {
        self.run(&["display-message", "-p", "-t", "top", format])
            .trim()
            .to_string()
    }

    /// Waits until the screen satisfies `cond`; returns that screen.
    #[track_caller]
    fn wait_for(&self, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        let deadline = std::time::Instant::now() + LIMIT;
        while std::time::Instant::now() < deadline {
            last = self.screen();
            if cond(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{what}: not on the screen after {LIMIT:?}:\n{last}");
    }

    fn keys(&self, keys: &str) {
        self.run(&["send-keys", "-t", "top", keys]);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

/// `commtap top` on `daemon`, a profile every 300 ms.
fn top_command(daemon: &Daemon) -> Vec<String> {
    let bin = commtap_bin().display().to_string();
    [
        bin.as_str(),
        "top",
        "--from",
        &daemon.target,
        "--interval",
        "300ms",
    ]
    .map(String::from)
    .to_vec()
}

/// The routine rows of a screen, in order: (name, calls).
fn routine_rows(screen: &str) -> Vec<(String, u64)> {
    screen
        .lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let name = cols.next()?;
            let calls = cols.next()?.parse().ok()?;
            name.starts_with("MPI_").then(|| (name.to_string(), calls))
        })
        .collect()
}

fn calls_of(screen: &str, routine: &str) -> Option<u64> {
    routine_rows(screen)
        .into_iter()
        .find(|(n, _)| n == routine)
        .map(|(_, c)| c)
}

#[test]
fn top_shows_a_daemons_job_and_obeys_its_keys() {
    let scratch = Scratch::new("top");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let hold = scratch.path("hold");
    let (mut job, _ranks) = start_waiting_loop(
        &scratch,
        Mpi::OpenMpi,
        2,
        N,
        &[("COMMTAP_TEST_HOLD", path_str(&hold))],
    );
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    let prefix = scratch.path("truth");
    let truth = |r: u32| PathBuf::from(format!("{}.{r}.json", prefix.display()));
    wait_until("both ranks' truths", LIMIT, || {
        (0..2).all(|r| {
            std::fs::read(truth(r))
                .is_ok_and(|b| serde_json::from_slice::<serde_json::Value>(&b).is_ok())
        })
    });
    // The ranks hold now: their counts stay still while top shows them.
    let truths = read_truths(&prefix, 2);
    let calls = |rank: usize, routine: &str| truths[rank]["routines"][routine]["calls"].as_u64();
    let allreduce = |rank: Option<usize>| match rank {
        Some(r) => calls(r, "MPI_Allreduce").expect("allreduce calls"),
        None => (0..2)
            .map(|r| calls(r, "MPI_Allreduce").expect("calls"))
            .sum(),
    };

    let tmux = Tmux {
        socket: scratch.path("tmux.sock"),
    };
    // Under a shell that outlives it, so the terminal it leaves behind can be looked at.
    let top = format!(
        "{} top --from {} --interval 300ms; echo \"top exited with $?\"; exec sleep 600",
        commtap_bin().display(),
        daemon.target
    );
    tmux.session("top", &["sh".into(), "-c".into(), top]);

    // The job's routines with the truth's counts; rates once a second profile came (none
    // move: the ranks hold).
    let screen = tmux.wait_for("MPI_Allreduce with both ranks' calls", |s| {
        calls_of(s, "MPI_Allreduce") == Some(allreduce(None))
            && s.lines()
                .any(|l| l.starts_with("MPI_Allreduce ") && l.contains("0/s"))
    });
    assert_eq!(
        calls_of(&screen, "MPI_Send"),
        Some((0..2).filter_map(|r| calls(r, "MPI_Send")).sum()),
        "{screen}"
    );
    assert!(screen.contains("sort: time share"), "{screen}");
    assert!(screen.contains("ranks: 2  hosts: 1"), "{screen}");
    // Nothing runs: every rate is 0, and the rows fall back on their calls, most first.
    let rows = routine_rows(&screen);
    assert!(
        rows.windows(2).all(|w| w[0].1 >= w[1].1),
        "by calls: {rows:?}"
    );

    // s: calls/s, bytes/s, then by name.
    tmux.keys("s");
    tmux.wait_for("sorted by calls/s", |s| s.contains("sort: calls/s"));
    tmux.keys("s");
    tmux.keys("s");
    let screen = tmux.wait_for("sorted by name", |s| s.contains("sort: name"));
    let names: Vec<String> = routine_rows(&screen).into_iter().map(|r| r.0).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "{screen}");

    // r: rank 0, then rank 1: one rank's counts and one busiest-rank row.
    tmux.keys("r");
    let screen = tmux.wait_for("rank 0 alone", |s| {
        s.contains("rank: 0") && calls_of(s, "MPI_Allreduce") == Some(allreduce(Some(0)))
    });
    assert!(screen.contains("ranks: 1  hosts: 1"), "{screen}");
    tmux.keys("r");
    tmux.wait_for("rank 1 alone", |s| {
        s.contains("rank: 1") && calls_of(s, "MPI_Allreduce") == Some(allreduce(Some(1)))
    });
    // j: the job (both ranks again), a: everything.
    tmux.keys("j");
    tmux.wait_for("the job", |s| {
        !s.contains("job: all")
            && s.contains("rank: all")
            && calls_of(s, "MPI_Allreduce") == Some(allreduce(None))
    });
    tmux.keys("a");
    tmux.wait_for("all jobs", |s| {
        s.contains("job: all") && s.contains("rank: all")
    });

    // p: paused and back.
    tmux.keys("p");
    tmux.wait_for("paused", |s| s.contains("[paused]"));
    tmux.keys("p");
    tmux.wait_for("running again", |s| !s.contains("[paused]"));

    // A smaller terminal: the screen is drawn again to its size, keys line at the bottom.
    tmux.run(&["resize-window", "-t", "top", "-x", "100", "-y", "30"]);
    let screen = tmux.wait_for("the smaller screen", |s| {
        let lines: Vec<&str> = s.lines().collect();
        lines.len() == 30
            && lines.iter().all(|l| l.chars().count() <= 100)
            && lines[29].starts_with("keys:")
            && calls_of(s, "MPI_Allreduce") == Some(allreduce(None))
    });
    assert!(screen.contains("MPI_Allreduce"), "{screen}");

    // q: top exits 0, out of the alternate screen, the cursor shown again (top hides it).
    assert_eq!(
        tmux.pane("#{alternate_on}"),
        "1",
        "top draws on the alternate screen"
    );
    assert_eq!(tmux.pane("#{cursor_flag}"), "0", "with the cursor hidden");
    tmux.keys("q");
    tmux.wait_for("the shell after top", |s| s.contains("top exited with 0"));
    assert_eq!(
        tmux.pane("#{alternate_on}"),
        "0",
        "the alternate screen was left"
    );
    assert_eq!(
        tmux.pane("#{cursor_flag}"),
        "1",
        "the cursor is shown again"
    );

    // A terminal that goes away (its tmux session killed: SIGHUP, the tty gone) leaves
    // nothing running: once, stale tops kept reading their streams behind dead terminals.
    tmux.session("gone", &top_command(&daemon));
    let pid: i32 = tmux
        .run(&["display-message", "-p", "-t", "gone", "#{pane_pid}"])
        .trim()
        .parse()
        .expect("pane pid");
    let on_screen = || {
        tmux.run(&["capture-pane", "-p", "-t", "gone"])
            .contains("MPI_Allreduce")
    };
    wait_until("the second top's screen", LIMIT, on_screen);
    tmux.run(&["kill-session", "-t", "gone"]);
    wait_until("top to exit with its terminal", LIMIT, || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });

    std::fs::write(&hold, b"").expect("hold file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    daemon.stop(&scratch);
}

/// While a job runs, its rates move: `mpi_loop` goes on until told to stop, and top's
/// MPI_Allreduce row shows calls per second and a share of time above zero.
#[test]
fn top_shows_the_rates_of_a_running_job() {
    let scratch = Scratch::new("top-rates");
    let daemon = Daemon::start(&scratch, &[], &[], &[]);
    let until = scratch.path("stop");
    let (mut job, _ranks) = start_waiting_loop(
        &scratch,
        Mpi::OpenMpi,
        2,
        1000,
        &[("COMMTAP_TEST_UNTIL", path_str(&until))],
    );
    std::fs::write(scratch.path("go"), b"go").expect("go file");
    let tmux = Tmux {
        socket: scratch.path("tmux.sock"),
    };
    tmux.session("top", &top_command(&daemon));
    // calls/s is the first column ending in "/s", the time share the last.
    let moving = |s: &str| {
        s.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"MPI_Allreduce")
                && cols
                    .iter()
                    .find(|c| c.ends_with("/s"))
                    .is_some_and(|c| *c != "0/s")
                && cols
                    .last()
                    .is_some_and(|c| c.ends_with('%') && *c != "0.0%")
        })
    };
    tmux.wait_for("MPI_Allreduce's rates above zero", moving);
    std::fs::write(&until, b"").expect("stop file");
    assert!(job.wait_with_limit(LIMIT).success(), "the MPI job failed");
    tmux.keys("q");
    daemon.stop(&scratch);
}

/// No daemon: a plain error on a plain terminal, commtap's exit status for errors (2).
#[test]
fn top_without_a_daemon_says_so() {
    let scratch = Scratch::new("top-no-daemon");
    let socket = scratch.path("none.sock");
    let run = run_commtap(
        &scratch,
        &["top", "--from", &format!("unix://{}", socket.display())],
        LIMIT,
    );
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(
        run.stderr.contains("watching the profiles") && run.stderr.contains("none.sock"),
        "{}",
        run.stderr
    );
    assert!(
        !run.stdout.contains('\u{1b}'),
        "no terminal control: {:?}",
        run.stdout
    );
}
