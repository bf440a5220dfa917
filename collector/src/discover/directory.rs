//! The node's user directory behind the C library (NSS: `/etc/passwd`, and LDAP or SSSD
//! where the node is configured so), asked for the users `/etc/subuid` names that
//! `/etc/passwd` lacks. A directory may take seconds to answer, or time out, and the
//! daemon's loop waits for nothing: lookups run on a thread of their own, their answers
//! are taken at a later look, and a lookup that hangs is given up on (a few such threads
//! at most).

use std::{
    collections::HashMap,
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
    /// Its answers so far (an old answer stands until a new one replaces it).
    answers: Answers,
    /// The lookup under way, and when it began.
    pending: Option<(mpsc::Receiver<Answers>, Instant)>,
    /// When names were last asked; none: ask now.
    asked_at: Option<Instant>,
    /// Lookup threads not yet returned, those given up on included.
    running: Arc<AtomicUsize>,
    ask_again: Duration,
    give_up: Duration,
}

impl Default for Directory {
    fn default() -> Self {
        Directory::new(look_up_user, ASK_AGAIN, GIVE_UP)
    }
}

impl Directory {
    /// A directory whose names `look_up` resolves, every name asked again after
    /// `ask_again`, a lookup given up on after `give_up`.
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

    /// Every name to be asked at the next look (the file they come from changed).
    pub fn ask_all_again(&mut self) {
        self.asked_at = None;
    }

    /// Takes the answers of a lookup that finished; whether there were any. A lookup past
    /// its time is given up on (its thread, if it ever returns, answers no one).
    pub fn take_answers(&mut self) -> bool {
        let Some((pending, since)) = &self.pending else {
            return false;
        };
        match pending.try_recv() {
            Ok(answers) => {
                self.pending = None;
                for (name, answer) in answers {
                    match answer {
                        // A failure does not undo what the directory said before.
                        Answer::NoAnswer => {
                            self.answers.entry(name).or_insert(answer);
                        }
                        _ => {
                            self.answers.insert(name, answer);
                        }
                    }
                }
                true
            }
            Err(mpsc::TryRecvError::Empty) if since.elapsed() < self.give_up => false,
            Err(mpsc::TryRecvError::Empty) => {
                warn!(
                    "the user directory has not answered in {:?}: asked again later",
                    self.give_up
                );
                self.pending = None;
                false
            }
            // Its thread ended without answering (it panicked): asked again later.
            Err(mpsc::TryRecvError::Disconnected) => {
                self.pending = None;
                false
            }
        }
    }

    /// Asks for what `names` needs: every name where they are due to be asked again, else
    /// those never asked. Not while a lookup is under way, nor while as many threads as
    /// allowed have not returned.
    pub fn ask_for(&mut self, names: &[String]) {
        if self.pending.is_some() {
            return;
        }
        let due = self.asked_at.is_none_or(|t| t.elapsed() >= self.ask_again);
        let wanted: Vec<String> = if due {
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
        if self.running.load(Ordering::SeqCst) >= MAX_RUNNING {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let look_up = self.look_up;
        let running = Arc::clone(&self.running);
        running.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("commtap-users".into())
            .spawn(move || {
                let _ = tx.send(answers_of(look_up, wanted));
                running.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(_) => {
                self.pending = Some((rx, Instant::now()));
                self.asked_at = Some(Instant::now());
            }
            Err(e) => {
                self.running.fetch_sub(1, Ordering::SeqCst);
                warn!("no thread to ask the user directory: {e}");
            }
        }
    }
}

/// Each of `names` looked up by `look_up`, on the caller's thread.
pub fn answers_of(look_up: fn(&str) -> Answer, names: Vec<String>) -> Answers {
    names
        .into_iter()
        .map(|n| {
            let answer = look_up(&n);
            (n, answer)
        })
        .collect()
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
        assert!(users.answers().is_empty());
    }

    fn failing_directory(name: &str) -> Answer {
        if name == "dave" {
            Answer::NoAnswer
        } else {
            Answer::User(7)
        }
    }

    #[test]
    fn a_failed_lookup_keeps_the_answer_before_it() {
        let mut users = Directory::new(failing_directory, Duration::ZERO, GIVE_UP);
        users.answers.insert("dave".into(), Answer::User(4343));
        users.ask_for(&["dave".to_string(), "erin".to_string()]);
        let deadline = Instant::now() + Duration::from_mins(1);
        while !users.take_answers() {
            assert!(Instant::now() < deadline, "no answer");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(users.answers()["dave"], Answer::User(4343));
        assert_eq!(users.answers()["erin"], Answer::User(7));
    }
}
