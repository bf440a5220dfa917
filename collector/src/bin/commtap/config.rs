//! Where options come from besides the command line: every option of every command is
//! also an environment variable (`COMMTAP_<COMMAND>_<OPTION>`, `COMMTAP_<OPTION>` for the
//! options of every command), and a TOML file (`--config FILE`, `COMMTAP_CONFIG`, else
//! [`DEFAULT_FILE`] where it exists) holds them too: top-level keys for the options of
//! every command, a `[command]` table for each command's. A flag wins over the environment,
//! which wins over the file, which wins over the defaults.
//!
//! Both are made from the command-line definition itself (clap's), so no option can be
//! missing from them, and `commtap config --example` prints every one with its help.

use std::{ffi::OsString, fmt::Write as _, path::Path};

use clap::{parser::ValueSource, Arg, ArgAction, ArgMatches, Command};

/// The configuration file read when none is named (and only if it exists).
pub const DEFAULT_FILE: &str = "/etc/commtap/commtap.toml";

/// Largest configuration file read: an operator's file is a few KiB.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The environment variable of option `arg` of `command` (None: an option of every command).
fn env_name(command: Option<&str>, long: &str) -> String {
    let opt = long.to_uppercase().replace('-', "_");
    match command {
        Some(c) => format!("COMMTAP_{}_{opt}", c.to_uppercase().replace('-', "_")),
        None => format!("COMMTAP_{opt}"),
    }
}

/// Whether `arg` is an option a file or the environment may give (not help, version or a
/// positional argument).
fn settable(arg: &Arg) -> bool {
    arg.get_long().is_some()
        && !matches!(
            arg.get_action(),
            ArgAction::Help | ArgAction::HelpLong | ArgAction::HelpShort | ArgAction::Version
        )
}

/// `cmd` with an environment variable for every option of its commands that has none.
pub fn with_env(cmd: Command) -> Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names.into_iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(&name, |sub| {
            let sub_name = sub.get_name().to_string();
            sub.mut_args(|arg| match arg.get_long() {
                Some(long) if settable(&arg) && arg.get_env().is_none() && !arg.is_global_set() => {
                    let env = env_name(Some(&sub_name), long);
                    arg.env(env)
                }
                _ => arg,
            })
        })
    })
}

/// The options a configuration file gave (`command` None: the options of every command),
/// by long name, for `config --show`.
#[derive(Debug, Default)]
pub struct FromFile {
    /// The file read, if any.
    pub path: Option<std::path::PathBuf>,
    /// Long names of the options it gave.
    pub options: Vec<String>,
}

/// `argv` with the configuration file's options added where neither a flag nor the
/// environment gave them. `argv` unchanged when no file applies, or when it does not parse
/// (the real parse says why, or prints the help asked for).
pub fn with_file(cmd: &Command, argv: Vec<OsString>) -> Result<(Vec<OsString>, FromFile), String> {
    // Leniently: what the file gives may be what the command line lacks (a required option).
    let Ok(first) = cmd.clone().ignore_errors(true).try_get_matches_from(&argv) else {
        return Ok((argv, FromFile::default()));
    };
    let named = first
        .try_get_raw("config")
        .ok()
        .flatten()
        .and_then(|mut v| v.next())
        .map(std::path::PathBuf::from);
    let path = match named {
        Some(p) => p,
        None if Path::new(DEFAULT_FILE).exists() => DEFAULT_FILE.into(),
        None => return Ok((argv, FromFile::default())),
    };
    let table = read(&path)?;
    check(cmd, &table).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some((name, sub_matches)) = first.subcommand() else {
        return Ok((argv, FromFile::default()));
    };
    let sub = cmd
        .find_subcommand(name)
        .expect("a subcommand that parsed exists");
    let mut global_tokens = Vec::new();
    let mut sub_tokens = Vec::new();
    let mut options = Vec::new();
    for (key, value) in &table {
        let (arg, matches, tokens) = match value {
            toml::Value::Table(section) if key == name => {
                for (key, value) in section {
                    let arg = find(sub, key).expect("checked");
                    if unset(sub_matches, arg) {
                        sub_tokens.extend(
                            tokens_of(arg, value)
                                .map_err(|e| format!("{}: [{name}] {key}: {e}", path.display()))?,
                        );
                        options.push(key.replace('_', "-"));
                    }
                }
                continue;
            }
            toml::Value::Table(_) => continue,
            _ => (find(cmd, key).expect("checked"), &first, &mut global_tokens),
        };
        if unset(matches, arg) {
            tokens.extend(
                tokens_of(arg, value).map_err(|e| format!("{}: {key}: {e}", path.display()))?,
            );
            options.push(key.replace('_', "-"));
        }
    }
    let at = subcommand_index(cmd, &argv, name);
    let mut out: Vec<OsString> = argv[..1].to_vec();
    out.extend(global_tokens);
    out.extend(argv[1..=at].iter().cloned());
    out.extend(sub_tokens);
    out.extend(argv[at + 1..].iter().cloned());
    Ok((
        out,
        FromFile {
            path: Some(path),
            options,
        },
    ))
}

/// The file, parsed.
fn read(path: &Path) -> Result<toml::Table, String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .map_err(|e| format!("configuration file {}: {e}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("configuration file {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "configuration file {}: larger than {MAX_FILE_BYTES} bytes",
            path.display()
        ));
    }
    text.parse::<toml::Table>()
        .map_err(|e| format!("configuration file {}: {e}", path.display()))
}

/// Refuses keys that name no option (a typo must not be ignored silently).
fn check(cmd: &Command, table: &toml::Table) -> Result<(), String> {
    for (key, value) in table {
        match value {
            toml::Value::Table(section) => {
                let sub = cmd
                    .get_subcommands()
                    .find(|s| s.get_name() == key && configurable(s))
                    .ok_or_else(|| {
                        format!(
                            "[{key}] is no command: the tables are {}",
                            commands(cmd).join(", ")
                        )
                    })?;
                for key in section.keys() {
                    if find(sub, key).is_none() {
                        return Err(format!(
                            "[{}] {key} is no option of `commtap {}`: it has {}",
                            sub.get_name(),
                            sub.get_name(),
                            options(sub).join(", ")
                        ));
                    }
                }
            }
            _ if key == "config" => {
                return Err("config: a configuration file names no other one".into());
            }
            _ if find(cmd, key).is_none() => {
                return Err(format!(
                    "{key} is no option of every command (they are {}); a command's options go in its [table]",
                    options(cmd).join(", ")
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether a file may have a table for command `sub`: a visible command with options of
/// its own (not `config` itself, which reads files rather than being set by one).
fn configurable(sub: &Command) -> bool {
    !sub.is_hide_set()
        && sub.get_name() != "config"
        && sub
            .get_arguments()
            .any(|a| settable(a) && !a.is_global_set())
}

/// The commands a file may have a table for.
fn commands(cmd: &Command) -> Vec<String> {
    cmd.get_subcommands()
        .filter(|s| configurable(s))
        .map(|s| format!("[{}]", s.get_name()))
        .collect()
}

/// The options a file may set at this level, as keys.
fn options(cmd: &Command) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| settable(a) && !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| l.replace('-', "_")))
        .collect()
}

/// The option a key names: its long name, with `_` or `-` alike.
fn find<'a>(cmd: &'a Command, key: &str) -> Option<&'a Arg> {
    let long = key.replace('_', "-");
    cmd.get_arguments()
        .find(|a| settable(a) && a.get_long() == Some(long.as_str()))
}

/// Whether neither a flag nor the environment gave `arg`.
fn unset(matches: &ArgMatches, arg: &Arg) -> bool {
    !matches!(
        matches.value_source(arg.get_id().as_str()),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The command-line tokens that give `arg` the file's `value`.
fn tokens_of(arg: &Arg, value: &toml::Value) -> Result<Vec<OsString>, String> {
    let long = arg.get_long().expect("settable options have a long name");
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        return match value {
            toml::Value::Boolean(true) => Ok(vec![format!("--{long}").into()]),
            toml::Value::Boolean(false) => Ok(Vec::new()),
            _ => Err("true or false".into()),
        };
    }
    let scalar = |v: &toml::Value| match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        _ => Err("a string, a number or a list of them".to_string()),
    };
    let values = match value {
        toml::Value::Array(items) if matches!(arg.get_action(), ArgAction::Append) => {
            items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?
        }
        toml::Value::Array(_) => return Err("one value, not a list".into()),
        v => vec![scalar(v)?],
    };
    // The default again changes nothing (and must not make an option that requires
    // another, or conflicts with one, count as given).
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && values == defaults {
        return Ok(Vec::new());
    }
    Ok(values
        .into_iter()
        .map(|v| format!("--{long}={v}").into())
        .collect())
}

/// Where the subcommand `name` is in `argv` (the options of every command before it may
/// take values, which are not it).
fn subcommand_index(cmd: &Command, argv: &[OsString], name: &str) -> usize {
    let takes_value = |token: &str| {
        cmd.get_arguments().any(|a| {
            a.get_action().takes_values()
                && (a.get_long().is_some_and(|l| token == format!("--{l}"))
                    || a.get_short().is_some_and(|s| token == format!("-{s}")))
        })
    };
    let mut i = 1;
    while i < argv.len() {
        let token = argv[i].to_string_lossy();
        if token == name {
            return i;
        }
        if takes_value(&token) {
            i += 1;
        }
        i += 1;
    }
    argv.len() - 1
}

/// `commtap config --example`: every option of every command, with its help, default and
/// environment variable, commented out.
pub fn example(cmd: &Command) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# commtap's configuration: {DEFAULT_FILE}, or the file --config (COMMTAP_CONFIG) names.\n\
         # Every key is the command-line option of the same name (tls_ca is --tls-ca); a value\n\
         # given on the command line, or in the environment variable named beside each, wins\n\
         # over this file. Top-level keys apply to every command; a command's own options go\n\
         # in its table. Uncomment what you set. `commtap config --show daemon` shows what\n\
         # `commtap daemon` would run with, and where each value came from.\n"
    );
    section(&mut out, cmd, None);
    for sub in cmd.get_subcommands() {
        if !configurable(sub) {
            continue;
        }
        let _ = writeln!(out, "\n[{}]", sub.get_name());
        section(&mut out, sub, Some(sub.get_name()));
    }
    out
}

/// One table of [`example`]: the options of `cmd` (`command` None: those of every command).
fn section(out: &mut String, cmd: &Command, command: Option<&str>) {
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if !settable(arg)
            || arg.is_hide_set()
            || long == "config"
            || (command.is_some() && arg.is_global_set())
        {
            continue;
        }
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        for line in textwrap(&help, 86) {
            let _ = writeln!(out, "# {line}");
        }
        let env = arg.get_env().map_or_else(
            || env_name(command, long),
            |e| e.to_string_lossy().into_owned(),
        );
        let key = long.replace('-', "_");
        let mut unset = "";
        let value = if matches!(arg.get_action(), ArgAction::SetTrue) {
            "false".to_string()
        } else {
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| toml::Value::String(v.to_string_lossy().into_owned()).to_string())
                .collect();
            if defaults.is_empty() {
                unset = " (unset by default)";
            }
            match (defaults.as_slice(), arg.get_action()) {
                ([], ArgAction::Append) => "[]".to_string(),
                ([], _) => format!(
                    "\"{}\"",
                    arg.get_value_names()
                        .and_then(|n| n.first())
                        .map_or_else(|| "VALUE".to_string(), ToString::to_string)
                ),
                (d, ArgAction::Append) => format!("[{}]", d.join(", ")),
                (d, _) => d.join(", "),
            }
        };
        let _ = writeln!(out, "#{key} = {value}    # {env}{unset}\n");
    }
}

/// `text` in lines of at most `width` characters (words kept whole).
fn textwrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}

/// `commtap config --show COMMAND [ARGS...]`: the options `commtap COMMAND ARGS...` would
/// run with, each with where its value came from (flag, environment, file, default).
pub fn show(cmd: &Command, argv: Vec<OsString>) -> Result<String, String> {
    let (argv, from_file) = with_file(cmd, argv)?;
    let matches = cmd
        .clone()
        .try_get_matches_from(&argv)
        .map_err(|e| e.to_string())?;
    let Some((name, sub_matches)) = matches.subcommand() else {
        return Err("name a command: `commtap config --show daemon`".into());
    };
    let sub = cmd.find_subcommand(name).expect("it parsed");
    let mut out = String::new();
    if let Some(path) = &from_file.path {
        let _ = writeln!(out, "# configuration file: {}", path.display());
    }
    let levels = [(cmd, &matches), (sub, sub_matches)];
    for (level, m) in levels {
        for arg in level.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if !settable(arg)
                || arg.is_hide_set()
                || (std::ptr::eq(level, sub) && arg.is_global_set())
            {
                continue;
            }
            let id = arg.get_id().as_str();
            let values: Vec<String> = m
                .get_raw(id)
                .map(|v| v.map(|v| v.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            let source = match m.value_source(id) {
                Some(ValueSource::CommandLine) if from_file.options.iter().any(|o| o == long) => {
                    "file"
                }
                Some(ValueSource::CommandLine) => "flag",
                Some(ValueSource::EnvVariable) => "environment",
                Some(ValueSource::DefaultValue) => "default",
                _ => "unset",
            };
            let shown = if matches!(arg.get_action(), ArgAction::SetTrue) {
                m.get_flag(id).to_string()
            } else {
                values.join(",")
            };
            let _ = writeln!(out, "{:<22} {:<12} {shown}", long.replace('-', "_"), source);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        with_env(
            Command::new("t")
                .arg(Arg::new("config").long("config").global(true))
                .arg(
                    Arg::new("log")
                        .long("log")
                        .global(true)
                        .default_value("warn"),
                )
                .subcommand(
                    Command::new("daemon")
                        .arg(Arg::new("socket").long("socket").default_value("/run/s"))
                        .arg(
                            Arg::new("verbose")
                                .long("verbose")
                                .action(ArgAction::SetTrue),
                        )
                        .arg(
                            Arg::new("library")
                                .long("library")
                                .action(ArgAction::Append),
                        )
                        .arg(Arg::new("cmd").num_args(0..).trailing_var_arg(true)),
                ),
        )
    }

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn file(text: &str) -> tempfile_path::Path {
        tempfile_path::Path::new(text)
    }

    /// A file of the test's, removed when dropped.
    mod tempfile_path {
        pub struct Path(pub std::path::PathBuf);
        impl Path {
            pub fn new(text: &str) -> Path {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "commtap-config-test-{}-{}.toml",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, text).expect("write");
                Path(p)
            }
            pub fn arg(&self) -> String {
                self.0.display().to_string()
            }
        }
        impl Drop for Path {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn the_file_fills_in_what_flags_did_not_give_and_goes_after_the_subcommand() {
        let f = file("log = \"info\"\n[daemon]\nsocket = \"/from/file\"\nverbose = true\nlibrary = [\"a\", \"b\"]\n");
        let cmd = cli();
        let (argv, from) =
            with_file(&cmd, args(&["t", "--config", &f.arg(), "daemon", "x", "y"])).unwrap();
        let m = cmd.clone().try_get_matches_from(&argv).unwrap();
        assert_eq!(m.get_one::<String>("log").unwrap(), "info");
        let (_, d) = m.subcommand().unwrap();
        assert_eq!(d.get_one::<String>("socket").unwrap(), "/from/file");
        assert!(d.get_flag("verbose"));
        let libs: Vec<&String> = d.get_many::<String>("library").unwrap().collect();
        assert_eq!(libs, ["a", "b"]);
        let rest: Vec<&String> = d.get_many::<String>("cmd").unwrap().collect();
        assert_eq!(rest, ["x", "y"], "the trailing command is left alone");
        assert_eq!(from.options.len(), 4);
        // A flag wins.
        let (argv, _) = with_file(
            &cmd,
            args(&["t", "--config", &f.arg(), "daemon", "--socket", "/flag"]),
        )
        .unwrap();
        let m = cmd.clone().try_get_matches_from(&argv).unwrap();
        assert_eq!(
            m.subcommand()
                .unwrap()
                .1
                .get_one::<String>("socket")
                .unwrap(),
            "/flag"
        );
    }

    #[test]
    fn the_file_may_give_what_the_command_requires() {
        let cmd = Command::new("t")
            .arg(Arg::new("config").long("config").global(true))
            .subcommand(
                Command::new("trace").arg(Arg::new("output").long("output").required(true)),
            );
        let f = file("[trace]\noutput = \"t.json\"\n");
        let (argv, _) = with_file(&cmd, args(&["t", "--config", &f.arg(), "trace"])).unwrap();
        let m = cmd.try_get_matches_from(&argv).unwrap();
        assert_eq!(
            m.subcommand()
                .unwrap()
                .1
                .get_one::<String>("output")
                .unwrap(),
            "t.json"
        );
    }

    #[test]
    fn every_option_has_its_environment_variable() {
        let cmd = cli();
        let d = cmd.find_subcommand("daemon").unwrap();
        let env = |id: &str| {
            d.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(env("socket").as_deref(), Some("COMMTAP_DAEMON_SOCKET"));
        assert_eq!(env("cmd"), None, "positional arguments have none");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_what_is_valid() {
        let cmd = cli();
        for (text, needle) in [
            (
                "[daemon]\nsokcet = \"/x\"\n",
                "sokcet is no option of `commtap daemon`: it has socket, verbose, library",
            ),
            ("[deamon]\nsocket = \"/x\"\n", "[deamon] is no command"),
            ("socket = \"/x\"\n", "socket is no option of every command"),
            ("[daemon]\nverbose = \"yes\"\n", "verbose: true or false"),
            (
                "[daemon]\nsocket = [\"/a\", \"/b\"]\n",
                "socket: one value, not a list",
            ),
            ("[daemon\n", "configuration file"),
        ] {
            let f = file(text);
            let e = with_file(&cmd, args(&["t", "--config", &f.arg(), "daemon"])).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        let e = with_file(
            &cmd,
            args(&["t", "--config", "/nonexistent/c.toml", "daemon"]),
        )
        .unwrap_err();
        assert!(e.contains("/nonexistent/c.toml"), "{e}");
    }

    #[test]
    fn the_example_parses_and_names_every_option() {
        let cmd = cli();
        let text = example(&cmd);
        // Every option uncommented (`#key = value    # ENV`; help lines are `# text`): a
        // valid file, whose placeholders are strings.
        let uncommented: String = text
            .lines()
            .filter_map(|l| match l.strip_prefix('#') {
                Some(rest) if !rest.starts_with(' ') && rest.contains(" = ") => {
                    Some(rest.split("    #").next().unwrap().to_string())
                }
                Some(_) => None,
                None => Some(l.to_string()),
            })
            .map(|l| l + "\n")
            .collect();
        let table: toml::Table = uncommented
            .parse()
            .expect("the example, uncommented, parses");
        check(&cmd, &table).expect("names only real options");
        let daemon = table["daemon"].as_table().unwrap();
        let keys: Vec<&String> = daemon.keys().collect();
        assert_eq!(keys, ["library", "socket", "verbose"]);
        assert_eq!(table["log"].as_str(), Some("warn"));
        assert!(!table.contains_key("config"), "a file names no other file");
        assert!(text.contains("# COMMTAP_DAEMON_SOCKET"), "{text}");
    }

    #[test]
    fn the_subcommand_is_found_past_the_values_of_options() {
        let cmd = cli();
        assert_eq!(
            subcommand_index(
                &cmd,
                &args(&["t", "--log", "daemon", "daemon", "x"]),
                "daemon"
            ),
            3
        );
        assert_eq!(subcommand_index(&cmd, &args(&["t", "daemon"]), "daemon"), 1);
    }
}
