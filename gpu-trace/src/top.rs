//! `gpu-trace top`: draws [`output::top`](crate::output::top)'s frames in the terminal with
//! ratatui, once a second, and reads the keys (`q`/Esc/Ctrl-C quit, `s` sorts). The terminal is
//! taken over at the first frame (after the start-up report was printed) and always given back:
//! on quit, on error and on unwinding.
//!
//! `gpu-trace replay FILE --top` steps through a recording with the same view ([`Top::stepping`]):
//! one frame per second of the recording's own time, `n`/space/→ for the next one, `p` to play
//! (a frame per second of wall time) or pause, `q` to stop.

use std::{
    io::{self, Stdout},
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
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
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Paragraph, Row, Table},
};

use crate::{
    model::stats::{KernelCounters, Stats},
    output::top::{Frame, TopModel},
    session::Viewer,
};

/// The live view.
pub struct Top {
    model: TopModel,
    terminal: Option<Terminal<CrosstermBackend<Stdout>>>,
    /// Sort requests from the key thread (a count of `s` presses).
    sort_presses: Arc<AtomicU8>,
    seen_presses: u8,
    /// What the tracer traces, for the title.
    what: String,
    /// Replay: keys are read between frames ([`Viewer::next`]), not by a thread.
    stepping: bool,
    playing: bool,
    /// The recording has no more records.
    ended: bool,
    /// The frame on the screen (redrawn when the sort changes while stepping).
    last: Option<Frame>,
    /// Report lines of the run (`--bpf-stats`), printed once the terminal is given back.
    report: Vec<String>,
}

impl Top {
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            model: TopModel::default(),
            terminal: None,
            sort_presses: Arc::new(AtomicU8::new(0)),
            seen_presses: 0,
            what: what.into(),
            stepping: false,
            playing: false,
            ended: false,
            last: None,
            report: Vec::new(),
        }
    }

    /// The view for stepping through a recording (`replay --top`).
    pub fn stepping(what: impl Into<String>) -> Self {
        let mut top = Self::new(what);
        top.stepping = true;
        top
    }

    fn help(&self) -> &'static str {
        match (self.stepping, self.ended, self.playing) {
            (false, ..) => "q: quit",
            (true, true, _) => "end of the recording   q: quit",
            (true, false, false) => "n/space: next second   p: play   q: quit",
            (true, false, true) => "playing   p: pause   q: quit",
        }
    }

    fn draw_last(&mut self) -> io::Result<()> {
        let Some(frame) = self.last.clone() else {
            return Ok(());
        };
        let what = self.what.clone();
        let help = self.help();
        let terminal = self.start()?;
        terminal.draw(|f| draw(f, &frame, &what, help))?;
        Ok(())
    }

    /// Replay: the keys until the next step (true) or quit (false). Playing, a step comes by
    /// itself after a second.
    fn keys(&mut self) -> io::Result<bool> {
        loop {
            if (self.playing && !self.ended) && !event::poll(Duration::from_secs(1))? {
                return Ok(true);
            }
            let Event::Key(k) = event::read()? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            if is_quit(&k) {
                return Ok(false);
            }
            match k.code {
                KeyCode::Char('n' | ' ') | KeyCode::Right | KeyCode::Enter if !self.ended => {
                    return Ok(true);
                }
                KeyCode::Char('p') if !self.ended => {
                    self.playing = !self.playing;
                    self.draw_last()?;
                    if self.playing {
                        return Ok(true);
                    }
                }
                KeyCode::Char('s') => {
                    self.model.sort = self.model.sort.next();
                    if let Some(f) = self.last.as_mut() {
                        f.resort(self.model.sort);
                    }
                    self.draw_last()?;
                }
                _ => {}
            }
        }
    }

    fn start(&mut self) -> io::Result<&mut Terminal<CrosstermBackend<Stdout>>> {
        if self.terminal.is_none() {
            self.terminal = Some(open_terminal()?);
            // Replay reads the keys between frames ([`Self::keys`]); live, a thread does.
            if !self.stepping {
                let presses = self.sort_presses.clone();
                // Quitting goes through SIGINT, which the live loop already stops on.
                std::thread::Builder::new()
                    .name("top-keys".into())
                    .spawn(move || {
                        loop {
                            let Ok(ev) = event::read() else { return };
                            let Event::Key(k) = ev else { continue };
                            if k.kind != KeyEventKind::Press {
                                continue;
                            }
                            if is_quit(&k) {
                                // SAFETY: kill(2) on this process.
                                unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                                return;
                            }
                            if k.code == KeyCode::Char('s') {
                                presses.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })?;
            }
        }
        Ok(self.terminal.as_mut().expect("started above"))
    }

    /// Gives the terminal back.
    pub fn stop(&mut self) {
        if let Some(mut t) = self.terminal.take() {
            let _ = t.show_cursor();
            let _ = execute!(t.backend_mut(), LeaveAlternateScreen);
            let _ = disable_raw_mode();
        }
        crate::session::print_report(std::mem::take(&mut self.report));
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
        let presses = self.sort_presses.load(Ordering::Relaxed);
        while self.seen_presses != presses {
            self.model.sort = self.model.sort.next();
            self.seen_presses = self.seen_presses.wrapping_add(1);
        }
        self.last = Some(self.model.frame(stats, elapsed.as_secs_f64(), counters));
        self.draw_last()
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
        self.draw_last()?;
        self.keys().map(|_| ())
    }
}

/// `q`, Esc or Ctrl-C.
fn is_quit(k: &KeyEvent) -> bool {
    matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
        || (k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL))
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

/// A share column: `33.0`, `-` without samples.
fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}", v * 100.0))
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "?".into(), |v| v.to_string())
}

fn draw(f: &mut ratatui::Frame, frame: &Frame, what: &str, help: &str) {
    let gpu_rows = frame.gpus.len().max(1) as u16;
    let [head, gpus, procs] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(gpu_rows + 3),
        Constraint::Min(3),
    ])
    .areas(f.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let health = if frame.dropped > 0 {
        format!("DROPPED {} (raise --ring-size)", frame.dropped)
    } else {
        "dropped 0".into()
    };
    f.render_widget(
        Paragraph::new(vec![
            Line::styled(
                format!(
                    "gpu-trace top — {what} — {:.0} s, {} events, {health}, emitted {}",
                    frame.elapsed_s, frame.events, frame.emitted
                ),
                bold,
            ),
            Line::raw(format!(
                "sorted by {} (s: next)   {help}",
                frame.sort.name()
            )),
        ]),
        head,
    );
    draw_gpus(f, frame, gpus, bold);
    let rows = frame.processes.iter().map(|p| {
        let live = if p.live.is_empty() {
            "0".to_string()
        } else {
            p.live
                .iter()
                .map(|(e, n)| format!("{e}:{n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        Row::new(vec![
            p.pid.to_string(),
            p.comm.clone(),
            p.group.clone().unwrap_or_else(|| "-".into()),
            live,
            format!("{:.1}", p.schedules_per_s),
            format!("{:.1}", p.refused_per_s),
            format!("{:.1}", p.updates_per_s),
            p.schedules.to_string(),
            p.refused.to_string(),
            percent(p.gpu_share),
            opt(p.timeslice_us),
            opt(p.init_to_schedule_us),
        ])
    });
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(8),
                Constraint::Length(16),
                Constraint::Length(24),
                Constraint::Min(14),
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Length(7),
                Constraint::Length(9),
                Constraint::Length(8),
                Constraint::Length(6),
                Constraint::Length(10),
                Constraint::Length(14),
            ],
        )
        .header(
            Row::new([
                "PID",
                "COMM",
                "CONTAINER/POD",
                "LIVE",
                "SCHED/s",
                "REFUSED/s",
                "UPD/s",
                "SCHEDULES",
                "REFUSED",
                "GPU%",
                "TIMESLICE",
                "INIT→SCHED us",
            ])
            .style(bold),
        )
        .block(Block::default().borders(Borders::TOP).title("Processes")),
        procs,
    );
}

/// The GPUs table: RM instance, nvidia-smi index and UUID, live tasks, GPU share.
fn draw_gpus(f: &mut ratatui::Frame, frame: &Frame, area: ratatui::layout::Rect, bold: Style) {
    let rows = frame.gpus.iter().map(|g| {
        Row::new(vec![
            g.gpu.map_or_else(|| "?".into(), |v| v.to_string()),
            g.name
                .as_ref()
                .map_or_else(|| "?".into(), |(i, _)| i.to_string()),
            g.name
                .as_ref()
                .and_then(|(_, u)| u.clone())
                .unwrap_or_else(|| "?".into()),
            g.live.to_string(),
            g.max_live.to_string(),
            percent(g.share),
        ])
    });
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(6),
                Constraint::Length(11),
                Constraint::Length(42),
                Constraint::Length(6),
                Constraint::Length(9),
                Constraint::Length(7),
            ],
        )
        .header(
            Row::new(["RM GPU", "NVIDIA-SMI", "UUID", "LIVE", "MAX_LIVE", "SHARE%"]).style(bold),
        )
        .block(Block::default().borders(Borders::TOP).title("GPUs")),
        area,
    );
}
