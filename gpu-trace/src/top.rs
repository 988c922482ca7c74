//! `gpu-trace top`: draws [`output::top`](crate::output::top)'s frames in the terminal with
//! ratatui, once a second, and reads the keys: `q`/Esc/Ctrl-C quit, `s` sorts, Up/Down, j/k,
//! PgUp/PgDn, Home/End scroll, `/` filters, `?`/`h`/F1 show the key help (the key handling is
//! [`View`]'s, pure). Exited processes are dimmed and marked `x`, then expire (`--expire`).
//! The terminal is taken over at the first frame (after the start-up report was printed) and
//! always given back: on quit, on error and on unwinding.
//!
//! `gpu-trace replay FILE --top` steps through a recording with the same view ([`Top::stepping`]):
//! one frame per second of the recording's own time, `n`/space/→ for the next one, `p` to play
//! (a frame per second of wall time) or pause, `q` to stop; the view keys work between steps.

mod draw;

use std::{
    io::{self, Stdout},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
        execute,
        terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
    },
};

use crate::{
    model::stats::{KernelCounters, Stats},
    output::top::{Action, Frame, Key, SortBy, TopModel, View},
    run::Viewer,
};

/// What the screen shows, shared by the frames and (live) the key thread, which redraws at
/// once on a key.
struct Screen {
    terminal: Option<Terminal<CrosstermBackend<Stdout>>>,
    /// Given back: nothing is drawn any more (a late key of the key thread).
    closed: bool,
    /// The frame on the screen (redrawn when a key changes the view).
    last: Option<Frame>,
    view: View,
    sort: SortBy,
    /// What the tracer traces, for the title.
    what: String,
    /// The keys of the mode (live, or replay's state).
    mode: &'static str,
    stepping: bool,
    expire_s: f64,
    /// Exited processes the frame no longer shows.
    expired: u64,
    /// Colours (not with `NO_COLOR` set).
    colour: bool,
    /// Rows the process table showed last (a page for PgUp/PgDn).
    page: usize,
    /// A warning shown under the title from the first frame on (no GPU driver to trace).
    notice: Option<String>,
}

impl Screen {
    fn draw(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        let Some(frame) = self.last.as_ref() else {
            return Ok(());
        };
        if self.terminal.is_none() {
            self.terminal = Some(open_terminal()?);
        }
        let ctx = draw::Context {
            what: &self.what,
            mode: self.mode,
            stepping: self.stepping,
            expire_s: self.expire_s,
            expired: self.expired,
            colour: self.colour,
            notice: self.notice.as_deref(),
        };
        let view = &mut self.view;
        let mut page = self.page;
        let terminal = self.terminal.as_mut().expect("opened above");
        terminal.draw(|f| page = draw::draw(f, frame, view, &ctx))?;
        self.page = page;
        Ok(())
    }

    /// Applies a key to the view (and the sort) and redraws.
    fn on_key(&mut self, key: Key) -> io::Result<Action> {
        let action = self.view.key(key, self.page);
        if action == Action::Sort {
            self.sort = self.sort.next();
            if let Some(f) = self.last.as_mut() {
                f.resort(self.sort);
            }
        }
        if matches!(action, Action::Sort | Action::Redraw) {
            self.draw()?;
        }
        Ok(action)
    }
}

/// The live view.
pub struct Top {
    model: TopModel,
    screen: Arc<Mutex<Screen>>,
    /// Replay: keys are read between frames ([`Viewer::next`]), not by a thread.
    stepping: bool,
    playing: bool,
    /// The recording has no more records.
    ended: bool,
    /// The key thread runs (live).
    reading_keys: bool,
    /// /proc shows the traced pids (gpu-trace runs in the host's PID namespace): live, a
    /// process whose /proc entry is gone exited.
    host_pids: bool,
    /// Report lines of the run (`--bpf-stats`), printed once the terminal is given back.
    report: Vec<String>,
}

impl Top {
    pub fn new(what: impl Into<String>) -> Self {
        let model = TopModel::default();
        let colour = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Self {
            screen: Arc::new(Mutex::new(Screen {
                terminal: None,
                closed: false,
                last: None,
                view: View::default(),
                sort: model.sort,
                what: what.into(),
                mode: "q: quit",
                stepping: false,
                expire_s: model.expire_s,
                expired: 0,
                colour,
                page: 1,
                notice: None,
            })),
            model,
            stepping: false,
            playing: false,
            ended: false,
            reading_keys: false,
            host_pids: in_init_pid_namespace(),
            report: Vec::new(),
        }
    }

    /// The view for stepping through a recording (`replay --top`).
    pub fn stepping(what: impl Into<String>) -> Self {
        let mut top = Self::new(what);
        top.stepping = true;
        top.screen().stepping = true;
        top.set_mode();
        top
    }

    /// Exited processes stay on the screen this long (seconds of the trace; 0: kept).
    pub fn expire(mut self, seconds: f64) -> Self {
        self.model.expire_s = seconds;
        self.screen().expire_s = seconds;
        self
    }

    /// Shows `line` under the title on every frame, from the first (a warning the start-up
    /// report printed on stderr, which the view would hide until it quits).
    pub fn notice(self, line: impl Into<String>) -> Self {
        self.screen().notice = Some(line.into());
        self
    }

    fn screen(&self) -> MutexGuard<'_, Screen> {
        self.screen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_mode(&mut self) {
        let mode = match (self.stepping, self.ended, self.playing) {
            (false, ..) => "q: quit",
            (true, true, _) => "end of the recording   q: quit",
            (true, false, false) => "n/space: next second   p: play   q: quit",
            (true, false, true) => "playing   p: pause   q: quit",
        };
        self.screen().mode = mode;
    }

    /// Replay: the keys until the next step (true) or quit (false). Playing, a step comes by
    /// itself after a second.
    fn keys(&mut self) -> io::Result<bool> {
        loop {
            if (self.playing && !self.ended) && !event::poll(Duration::from_secs(1))? {
                return Ok(true);
            }
            let k = match event::read()? {
                Event::Key(k) if k.kind == KeyEventKind::Press => k,
                Event::Resize(..) => {
                    self.screen().draw()?;
                    continue;
                }
                _ => continue,
            };
            if is_interrupt(&k) {
                return Ok(false);
            }
            let Some(key) = key_of(&k) else { continue };
            match self.screen().on_key(key)? {
                Action::Quit => return Ok(false),
                Action::Other => {}
                Action::Sort | Action::Redraw => continue,
            }
            match key {
                Key::Char('n' | ' ') | Key::Right | Key::Enter if !self.ended => return Ok(true),
                Key::Char('p') if !self.ended => {
                    self.playing = !self.playing;
                    self.set_mode();
                    self.screen().draw()?;
                    if self.playing {
                        return Ok(true);
                    }
                }
                _ => {}
            }
        }
    }

    /// Live: a thread reads the keys and redraws the view at once; quitting goes through
    /// SIGINT, which the live loop already stops on.
    fn read_keys(&mut self) -> io::Result<()> {
        if self.stepping || self.reading_keys {
            return Ok(());
        }
        self.reading_keys = true;
        let screen = self.screen.clone();
        std::thread::Builder::new()
            .name("top-keys".into())
            .spawn(move || {
                let quit = || {
                    // SAFETY: kill(2) on this process.
                    unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                };
                loop {
                    let Ok(ev) = event::read() else { return };
                    let mut s = screen.lock().unwrap_or_else(PoisonError::into_inner);
                    match ev {
                        Event::Key(k) if k.kind == KeyEventKind::Press => {
                            if is_interrupt(&k) {
                                return quit();
                            }
                            let Some(key) = key_of(&k) else { continue };
                            if matches!(s.on_key(key), Ok(Action::Quit)) {
                                return quit();
                            }
                        }
                        Event::Resize(..) => {
                            let _ = s.draw();
                        }
                        _ => {}
                    }
                }
            })?;
        Ok(())
    }

    /// Gives the terminal back.
    pub fn stop(&mut self) {
        let terminal = {
            let mut s = self.screen();
            s.closed = true;
            s.terminal.take()
        };
        if let Some(mut t) = terminal {
            let _ = t.show_cursor();
            let _ = execute!(t.backend_mut(), LeaveAlternateScreen);
            let _ = disable_raw_mode();
        }
        crate::run::print_report(std::mem::take(&mut self.report));
    }
}

impl Drop for Top {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Viewer for Top {
    fn report(&mut self, lines: Vec<String>) {
        // The alternate screen would swallow them.
        self.report.extend(lines);
    }

    fn frame(
        &mut self,
        stats: &Stats,
        elapsed: Duration,
        counters: Option<KernelCounters>,
    ) -> io::Result<()> {
        let sort = self.screen().sort;
        self.model.sort = sort;
        let elapsed = elapsed.as_secs_f64();
        let frame = if self.stepping || !self.host_pids {
            self.model.frame(stats, elapsed, counters)
        } else {
            // Live: a process whose /proc entry is gone exited, even if it freed its tasks.
            self.model
                .frame_with(stats, elapsed, counters, &|pid| !proc_exists(pid))
        };
        {
            let expired = self.model.expired();
            let mut s = self.screen();
            s.last = Some(frame);
            s.expired = expired;
            s.draw()?;
        }
        self.read_keys()
    }

    fn next(&mut self) -> io::Result<bool> {
        if !self.stepping {
            return Ok(true);
        }
        self.keys()
    }

    fn at_end(&mut self) -> io::Result<()> {
        if !self.stepping {
            return Ok(());
        }
        self.ended = true;
        self.set_mode();
        self.screen().draw()?;
        self.keys().map(|_| ())
    }
}

/// Whether gpu-trace runs in the initial PID namespace, whose pids the kernel programs report
/// (its namespace inode is fixed: `PROC_PID_INIT_INO`). In a container without the host's PID
/// namespace /proc would not show the traced processes, and every row would look exited.
fn in_init_pid_namespace() -> bool {
    std::fs::read_link("/proc/self/ns/pid").is_ok_and(|l| l.as_os_str() == "pid:[4026531836]")
}

/// Whether /proc/PID exists.
fn proc_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Ctrl-C: quits whatever the view is doing (a filter being typed included).
fn is_interrupt(k: &KeyEvent) -> bool {
    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL)
}

/// The view's key of a terminal key.
fn key_of(k: &KeyEvent) -> Option<Key> {
    Some(match k.code {
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::F(1) => Key::F1,
        KeyCode::Char(c) if !k.modifiers.contains(KeyModifiers::CONTROL) => Key::Char(c),
        _ => return None,
    })
}

/// The terminal in raw mode on the alternate screen, cursor hidden.
fn open_terminal() -> io::Result<Terminal<CrosstermBackend<Stdout>>> {
    enable_raw_mode()?;
    let mut out = io::stdout();
    if let Err(e) = execute!(out, EnterAlternateScreen) {
        let _ = disable_raw_mode();
        return Err(e);
    }
    let mut terminal = Terminal::new(CrosstermBackend::new(out))?;
    terminal.hide_cursor()?;
    terminal.clear()?;
    Ok(terminal)
}

/// What `top` says on screen when the driver of `vendor` is not there to trace (`None`: it is):
/// the start-up warning's words, which stderr alone shows only after the view quits.
pub fn driver_notice(vendor: crate::cli::Vendor) -> Option<String> {
    match vendor {
        crate::cli::Vendor::Amd => crate::probe::amd::KfdPresence::probe().warning(),
        _ => crate::probe::system::nvidia_not_loaded_warning(),
    }
    .map(|w| format!("warning: {w}"))
}
