//! The node's user directory behind the C library (NSS: `/etc/passwd`, and LDAP or SSSD
//! where the node is configured so), asked for the users `/etc/subuid` names that
//! `/etc/passwd` lacks. A directory may take seconds to answer, or time out, and the
//! daemon's loop waits for nothing: lookups run on a thread of their own, their answers
//! are taken at a later look, and a lookup that hangs is given up on (a few such threads
//! at most).

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use tracing::warn;

/// What the directory said of a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The user's uid.
    User(u32),
    /// It has no such user.
    NoSuchUser,
    /// The lookup failed (the directory unreachable): asked again later.
    NoAnswer,
}

/// The directory's answers, by name.
pub type Answers = HashMap<String, Answer>;

/// How often every name is asked again (users made or renumbered since, a directory back
/// after failing), unless told otherwise.
const ASK_AGAIN: Duration = Duration::from_mins(5);

/// How long a lookup may take before it is given up on, unless told otherwise.
const GIVE_UP: Duration = Duration::from_mins(1);

/// The lookup threads that may be running at once, hung ones given up on included: a
/// directory that never answers holds no more.
const MAX_RUNNING: usize = 4;

/// Asks the directory for names, off the caller's thread, and keeps its answers.
pub struct Directory {
    /// How a name is looked up ([`look_up_user`]; a test's own).
    look_up: fn(&str) -> Answer,
    /// Its answers so far (an old answer stands until a new one replaces it), for the
    /// names last asked.
    answers: Answers,
    /// The lookup under way.
    pending: Option<Lookup>,
    /// When every name was last asked; none: ask them now.
    asked_at: Option<Instant>,
    /// Lookup threads not yet returned, those given up on included.
    running: Arc<AtomicUsize>,
    ask_again: Duration,
    give_up: Duration,
}

/// A lookup under way, answering name by name: a long list is not lost to one slow name.
struct Lookup {
    /// Its answers, in the order asked.
    answers: mpsc::Receiver<(String, Answer)>,
    /// The names asked, in order.
    asked: Vec<String>,
    /// How many have been answered.
    answered: usize,
    /// When it last answered (or began).
    progress: Instant,
    /// Whether an answer changed a name's user.
    changed: bool,
}

/// Counts a lookup thread until it returns (or is never started).
struct Running(Arc<AtomicUsize>);

impl Running {
    fn new(count: &Arc<AtomicUsize>) -> Running {
        count.fetch_add(1, Ordering::SeqCst);
        Running(Arc::clone(count))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for Directory {
    fn default() -> Self {
        Directory::new(look_up_user, ASK_AGAIN, GIVE_UP)
    }
}

impl Directory {
    /// A directory whose names `look_up` resolves, every name asked again after
    /// `ask_again`, a lookup given up on after `give_up` without an answer.
    pub fn new(look_up: fn(&str) -> Answer, ask_again: Duration, give_up: Duration) -> Self {
        Directory {
            look_up,
            answers: Answers::new(),
            pending: None,
            asked_at: None,
            running: Arc::new(AtomicUsize::new(0)),
            ask_again,
            give_up,
        }
    }

    /// Its answers so far.
    pub fn answers(&self) -> &Answers {
        &self.answers
    }

    /// Whether a lookup is under way.
    pub fn asking(&self) -> bool {
        self.pending.is_some()
    }

    /// Every name to be asked at the next look (the file they come from changed).
    pub fn ask_all_again(&mut self) {
        self.asked_at = None;
    }

    /// Takes the answers come so far; whether the lookup ended with a name's user changed
    /// (then the names are worth resolving again). A lookup with no answer for longer than
    /// its time is given up on, and the name it waits on left unanswered until every name
    /// is asked again (its thread, if it ever returns, answers no one).
    pub fn take_answers(&mut self) -> bool {
        let Some(lookup) = self.pending.as_mut() else {
            return false;
        };
        loop {
            match lookup.answers.try_recv() {
                Ok((name, answer)) => {
                    lookup.answered += 1;
                    lookup.progress = Instant::now();
                    lookup.changed |= keep(&mut self.answers, name, answer);
                }
                Err(mpsc::TryRecvError::Empty) if lookup.progress.elapsed() < self.give_up => {
                    return false;
                }
                Err(mpsc::TryRecvError::Empty) => {
                    warn!(
                        "the user directory has not answered in {:?}: given up on, asked again \
                         later",
                        self.give_up
                    );
                    break;
                }
                Err(mpsc::TryRecvError::Disconnected) => break,
            }
        }
        // A name left unanswered (the lookup given up on, or its thread gone on it) is not
        // asked again at once: it would only hang or fail the next lookup too.
        if let Some(name) = lookup.asked.get(lookup.answered) {
            self.answers.entry(name.clone()).or_insert(Answer::NoAnswer);
        }
        let changed = lookup.changed;
        self.pending = None;
        changed
    }

    /// Asks for what `names` needs: every name where they are due to be asked again (the
    /// answers of names no longer among them dropped), else those never asked. Not while
    /// a lookup is under way, nor while as many threads as allowed have not returned.
    pub fn ask_for(&mut self, names: &[String]) {
        if self.pending.is_some() || self.running.load(Ordering::SeqCst) >= MAX_RUNNING {
            return;
        }
        let due = self.asked_at.is_none_or(|t| t.elapsed() >= self.ask_again);
        let wanted: Vec<String> = if due {
            let current: HashSet<&str> = names.iter().map(String::as_str).collect();
            self.answers.retain(|n, _| current.contains(n.as_str()));
            self.asked_at = Some(Instant::now());
            names.to_vec()
        } else {
            names
                .iter()
                .filter(|n| !self.answers.contains_key(*n))
                .cloned()
                .collect()
        };
        if wanted.is_empty() {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let look_up = self.look_up;
        let running = Running::new(&self.running);
        let asked = wanted.clone();
        let spawned = std::thread::Builder::new()
            .name("commtap-users".into())
            .spawn(move || {
                let _running = running;
                for name in wanted {
                    let answer = look_up(&name);
                    if tx.send((name, answer)).is_err() {
                        // Given up on.
                        return;
                    }
                }
            });
        match spawned {
            Ok(_) => {
                self.pending = Some(Lookup {
                    answers: rx,
                    asked,
                    answered: 0,
                    progress: Instant::now(),
                    changed: false,
                });
            }
            Err(e) => {
                warn!("no thread to ask the user directory: {e}; asked again later");
                // Not asked again at every look: only when every name is.
                for name in asked {
                    self.answers.entry(name).or_insert(Answer::NoAnswer);
                }
            }
        }
    }
}

/// Keeps `answer` for `name`; whether it changed the name's user. A failure never
/// replaces an answer.
fn keep(answers: &mut Answers, name: String, answer: Answer) -> bool {
    let user = |a: Option<&Answer>| match a {
        Some(Answer::User(uid)) => Some(*uid),
        _ => None,
    };
    if answer == Answer::NoAnswer {
        answers.entry(name).or_insert(answer);
        return false;
    }
    let before = user(answers.get(&name));
    answers.insert(name, answer);
    before != user(Some(&answer))
}

/// What the C library (`getpwnam_r`: `/etc/passwd`, then whatever directory the node's NSS
/// names) says of user `name`. May wait on the directory.
pub fn look_up_user(name: &str) -> Answer {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => Answer::User(u.uid.as_raw()),
        Ok(None) => Answer::NoSuchUser,
        Err(_) => Answer::NoAnswer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_library_resolves_this_nodes_users() {
        assert_eq!(look_up_user("root"), Answer::User(0));
        assert_eq!(look_up_user("no-such-user-of-commtap"), Answer::NoSuchUser);
    }

    /// Never set: the hung directory's lookups never return.
    static HUNG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    fn hung_directory(_: &str) -> Answer {
        while !HUNG.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Answer::NoSuchUser
    }

    #[test]
    fn a_directory_that_never_answers_holds_a_few_threads_and_never_the_caller() {
        let mut users = Directory::new(hung_directory, Duration::ZERO, Duration::ZERO);
        let names = ["carol".to_string()];
        for _ in 0..3 * MAX_RUNNING {
            let began = Instant::now();
            assert!(!users.take_answers());
            users.ask_for(&names);
            assert!(
                began.elapsed() < Duration::from_secs(5),
                "the caller waited"
            );
        }
        assert_eq!(users.running.load(Ordering::SeqCst), MAX_RUNNING);
        assert_eq!(users.answers().get("carol"), Some(&Answer::NoAnswer));
    }

    fn failing_directory(name: &str) -> Answer {
        if name == "dave" {
            Answer::NoAnswer
        } else {
            Answer::User(7)
        }
    }

    #[test]
    fn a_failed_lookup_keeps_the_answer_before_it_and_is_not_asked_again_at_once() {
        let mut users = Directory::new(failing_directory, Duration::from_mins(5), GIVE_UP);
        users.answers.insert("dave".into(), Answer::User(4343));
        let names = ["dave".to_string(), "erin".to_string(), "fay".to_string()];
        let deadline = Instant::now() + Duration::from_mins(1);
        let answered = |users: &mut Directory| {
            while users.asking() {
                assert!(Instant::now() < deadline, "no answer");
                users.take_answers();
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // Not due (asked just now): only the names never asked.
        users.asked_at = Some(Instant::now());
        users.ask_for(&names);
        answered(&mut users);
        assert_eq!(users.answers()["dave"], Answer::User(4343));
        assert_eq!(users.answers()["erin"], Answer::User(7));
        assert_eq!(users.answers()["fay"], Answer::User(7));
        // Due: every name asked again, dave's failure keeps his answer, and the answers of
        // names no longer asked for are dropped.
        users.ask_all_again();
        users.ask_for(&names[..1]);
        assert!(users.asking());
        answered(&mut users);
        assert_eq!(users.answers().len(), 1);
        assert_eq!(users.answers()["dave"], Answer::User(4343));
    }
}
