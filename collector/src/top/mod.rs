//! `commtap top`: a live terminal view of a daemon or an aggregator, fed by the same watch
//! streams as `report --watch` (the server paces them: top never asks faster). The stream
//! runs as a task; the screen and the keys run on a thread of their own, so a slow server
//! never freezes the keys and a key never waits for the network. The terminal is put back
//! on every way out: `q`, Ctrl-C, SIGTERM or SIGHUP, the end of the stream, a panic.

mod model;
mod view;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::{api::transport::Target, client, profile::JobProfile};
use model::{Filter, Model, SortKey};

/// What `commtap top` watches.
#[derive(Clone, Debug)]
pub struct TopOptions {
    /// A daemon or an aggregator.
    pub from: Target,
    /// Only this job (an aggregator needs one).
    pub job: Option<String>,
    /// How often the server sends a profile.
    pub every: Duration,
}

/// What a stream task hands the screen, tagged with the stream's generation: a job
/// chosen with `j` starts a new stream (the server filters, so "who is late" is that
/// job's), and what the old one still had in flight is dropped.
enum Update {
    Profile(u64, Instant, Box<JobProfile>),
    Ended(u64, String),
}

/// The watch stream of the moment, restarted for another job.
struct Stream {
    runtime: tokio::runtime::Handle,
    from: Target,
    every: Duration,
    tx: mpsc::Sender<Update>,
    generation: u64,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Stream {
    /// Starts the stream of `job` (all: none); `first` hears of its first profile or its
    /// end, whichever comes first.
    fn start(
        runtime: tokio::runtime::Handle,
        opts: &TopOptions,
        job: Option<String>,
        tx: mpsc::Sender<Update>,
        first: tokio::sync::oneshot::Sender<Result<()>>,
    ) -> Stream {
        let mut stream = Stream {
            runtime,
            from: opts.from.clone(),
            every: opts.every,
            tx,
            generation: 0,
            task: None,
        };
        stream.spawn(job, Some(first));
        stream
    }

    /// Stops this stream and starts one for `job`.
    fn restart(&mut self, job: Option<String>) {
        self.generation += 1;
        self.spawn(job, None);
    }

    fn spawn(
        &mut self,
        job: Option<String>,
        first: Option<tokio::sync::oneshot::Sender<Result<()>>>,
    ) {
        if let Some(old) = self.task.take() {
            old.abort();
        }
        self.task = Some(self.runtime.spawn(watch(
            self.from.clone(),
            job,
            self.every,
            self.generation,
            self.tx.clone(),
            first,
        )));
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// One watch stream's task: profiles to the screen until it is gone or the stream ends.
async fn watch(
    from: Target,
    job: Option<String>,
    every: Duration,
    generation: u64,
    tx: mpsc::Sender<Update>,
    mut first: Option<tokio::sync::oneshot::Sender<Result<()>>>,
) {
    let result = client::watch_profiles(&from, job.as_deref(), every, |p| {
        if let Some(f) = first.take() {
            let _ = f.send(Ok(()));
        }
        // The screen is gone: stop.
        Ok(tx
            .send(Update::Profile(generation, Instant::now(), Box::new(p)))
            .is_err())
    })
    .await;
    let end = match result {
        Ok(()) => "the server closed the stream".to_string(),
        Err(e) => format!("{e:#}"),
    };
    match first.take() {
        Some(f) => {
            let _ = f.send(Err(anyhow::anyhow!(end)));
        }
        None => {
            let _ = tx.send(Update::Ended(generation, end));
        }
    }
}

/// Runs until the user quits. The first profile is awaited before the terminal is taken,
/// so a daemon that is not there is a plain error on a plain terminal.
pub async fn run(opts: TopOptions) -> Result<()> {
    use std::io::IsTerminal as _;
    let (tx, rx) = mpsc::channel();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<()>>();
    let stream = Stream::start(
        tokio::runtime::Handle::current(),
        &opts,
        opts.job.clone(),
        tx,
        first_tx,
    );
    match first_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e).context("watching the profiles"),
        Err(_) => anyhow::bail!("the profile stream stopped before its first profile"),
    }
    // After the first profile: a daemon that is not there says so first.
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "`commtap top` draws on a terminal, and this is none; for plain text every few \
             seconds: `commtap report --from {}{} --watch 2s`",
            opts.from,
            opts.job
                .as_deref()
                .map(|j| format!(" --job {j}"))
                .unwrap_or_default()
        );
    }

    let quit = Arc::new(AtomicBool::new(false));
    // A thread of its own, not tokio's blocking pool: the runtime's end does not wait for
    // it, so a screen stuck on a dead terminal cannot keep the process alive.
    let (done_tx, mut done) = tokio::sync::oneshot::channel();
    {
        let quit = quit.clone();
        std::thread::Builder::new()
            .name("commtap-top-screen".into())
            .spawn(move || {
                let _ = done_tx.send(screen(&opts, stream, &rx, &quit));
            })
            .context("starting the screen's thread")?;
    }
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut hup) = (
        signal(SignalKind::terminate()).context("SIGTERM handler")?,
        signal(SignalKind::hangup()).context("SIGHUP handler")?,
    );
    let signalled = tokio::select! {
        ended = &mut done => return ended.context("the screen's thread ended")?,
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    };
    // The screen notices within one key wait; a terminal that hung up may keep it from
    // ever reading its flag (crossterm waits on a dead tty), so past a second top leaves
    // without it: nothing is left running behind a closed terminal.
    quit.store(true, Ordering::Relaxed);
    if let Ok(ended) = tokio::time::timeout(Duration::from_secs(1), &mut done).await {
        return ended.context("the screen's thread ended")?;
    }
    ratatui::restore();
    anyhow::bail!("{signalled}: the screen did not stop; leaving without it")
}

/// The screen's loop: draw, then wait up to 100 ms for a key, then take what came.
fn screen(
    opts: &TopOptions,
    mut stream: Stream,
    rx: &mpsc::Receiver<Update>,
    quit: &AtomicBool,
) -> Result<()> {
    let mut terminal = ratatui::try_init().context("taking the terminal")?;
    let source = opts.from.to_string();
    let result = (|| -> Result<()> {
        let mut model = Model::default();
        let mut filter = Filter {
            job: opts.job.clone(),
            rank: None,
        };
        // Jobs seen while unfiltered: what `j` steps through.
        let mut jobs = std::collections::BTreeSet::new();
        let mut sort = SortKey::Time;
        let mut paused = false;
        let mut held: Vec<(Instant, JobProfile)> = Vec::new();
        let mut updates = 0u64;
        let mut ended: Option<String> = None;
        loop {
            let screen = model.screen(&filter, sort);
            let status = view::Status {
                source: &source,
                every_s: opts.every.as_secs_f64(),
                filter: &filter,
                sort,
                paused,
                updates,
                ended: ended.as_deref(),
            };
            terminal.draw(|f| view::draw(f, screen.as_ref(), &status))?;
            if quit.load(Ordering::Relaxed) {
                return Ok(());
            }
            if event::poll(Duration::from_millis(100))? {
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            return Ok(())
                        }
                        KeyCode::Char('s') => sort = sort.next(),
                        KeyCode::Char(c @ ('j' | 'a')) => {
                            let job = if c == 'j' {
                                let all: Vec<String> = jobs.iter().cloned().collect();
                                next(&all, filter.job.as_ref())
                            } else {
                                None
                            };
                            filter = Filter { job, rank: None };
                            stream.restart(filter.job.clone());
                            model = Model::default();
                            held.clear();
                            ended = None;
                        }
                        KeyCode::Char('r') => {
                            let ranks = model.ranks_of(filter.job.as_deref());
                            filter.rank = next(&ranks, filter.rank.as_ref());
                        }
                        KeyCode::Char('p' | ' ') => paused = !paused,
                        _ => {}
                    },
                    // The next draw fits the new size.
                    _ => {}
                }
            }
            while let Ok(u) = rx.try_recv() {
                match u {
                    Update::Profile(g, at, p) if g == stream.generation => {
                        updates += 1;
                        jobs.extend(p.ranks.iter().map(|r| r.job.clone()));
                        held.push((at, *p));
                    }
                    Update::Ended(g, why) if g == stream.generation => ended = Some(why),
                    _ => {}
                }
            }
            // Paused: the stream is still read (the server is never held up), the screen
            // keeps the last two profiles it showed until unpaused.
            if !paused {
                let keep = held.len().saturating_sub(2);
                for (at, p) in held.drain(..).skip(keep) {
                    model.update(at, p);
                }
            } else if held.len() > 2 {
                held.drain(..held.len() - 2);
            }
        }
    })();
    ratatui::restore();
    result
}

/// The value after `current` in `all`, then none ("all"), then the first again.
fn next<T: Clone + PartialEq>(all: &[T], current: Option<&T>) -> Option<T> {
    match current.and_then(|c| all.iter().position(|x| x == c)) {
        None => all.first().cloned(),
        Some(i) => all.get(i + 1).cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::next;

    #[test]
    fn filters_cycle_through_all() {
        let all = [3, 5];
        assert_eq!(next(&all, None), Some(3));
        assert_eq!(next(&all, Some(&3)), Some(5));
        assert_eq!(next(&all, Some(&5)), None);
        assert_eq!(next::<u32>(&[], None), None);
    }
}
