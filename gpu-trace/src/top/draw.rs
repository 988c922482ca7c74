//! Draws one frame of `top`: the title, the sort and key lines, the GPUs, the processes that
//! pass the filter (the window the view scrolled to, "+N more" under it, columns dropped by
//! priority on a narrow terminal) and, on `?`, the key help over them.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, Wrap},
};

use crate::output::top::{
    Column, Frame, View, has_api, help_lines, layout_for, percent, sort_line, status_line,
};

/// What the frame does not carry.
pub(super) struct Context<'a> {
    pub what: &'a str,
    pub mode: &'a str,
    pub stepping: bool,
    pub expire_s: f64,
    /// Exited processes no longer shown ([`TopModel::expired`](crate::output::top::TopModel::expired)).
    pub expired: u64,
    pub colour: bool,
    /// A warning under the title ([`Top::notice`](super::Top::notice)).
    pub notice: Option<&'a str>,
}

/// Draws `frame`; the rows the process table has room for (a page).
pub(super) fn draw(f: &mut ratatui::Frame, frame: &Frame, view: &mut View, ctx: &Context) -> usize {
    let gpu_rows = frame.gpus.len().max(1) as u16;
    // The notice's lines at this width (it wraps at words: a line more than its length needs).
    let width = usize::from(f.area().width.max(1));
    let notice_rows = ctx.notice.map_or(0, |n| {
        let chars = n.chars().count();
        chars.div_ceil(width) + usize::from(chars > width)
    }) as u16;
    let [head, notice, gpus, procs] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(notice_rows),
        Constraint::Length(gpu_rows + 3),
        Constraint::Min(4),
    ])
    .areas(f.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    if let Some(n) = ctx.notice {
        // Red like the refusals, or bold without colours.
        let style = if ctx.colour {
            bold.fg(Color::Red)
        } else {
            bold
        };
        f.render_widget(
            Paragraph::new(Line::styled(n, style)).wrap(Wrap { trim: false }),
            notice,
        );
    }
    let health = if frame.dropped > 0 {
        format!("DROPPED {} (raise --ring-size)", frame.dropped)
    } else {
        "dropped 0".into()
    };
    f.render_widget(
        Paragraph::new(vec![
            Line::styled(
                // What is traced last: a long recording name is what a narrow terminal cuts.
                format!(
                    "gpu-trace top — {:.0} s, {} events, {health}, emitted {} — {}",
                    frame.elapsed_s, frame.events, frame.emitted, ctx.what
                ),
                bold,
            ),
            Line::raw(sort_line(frame.sort)),
            Line::raw(format!("{}   /: filter   ?: help", ctx.mode)),
        ]),
        head,
    );
    draw_gpus(f, frame, gpus, bold);
    let page = draw_processes(f, frame, view, ctx, procs);
    if view.help {
        draw_help(f, ctx.stepping);
    }
    page
}

/// The process table and its status line; the rows it has room for.
fn draw_processes(
    f: &mut ratatui::Frame,
    frame: &Frame,
    view: &mut View,
    ctx: &Context,
    area: Rect,
) -> usize {
    let [table, status] = Layout::vertical([Constraint::Min(3), Constraint::Length(1)]).areas(area);
    // The block's top border and the header take a line each.
    let page = usize::from(table.height.saturating_sub(2)).max(1);
    let rows = view.rows(frame);
    let window = view.window(rows.len(), page);
    let cols = layout_for(area.width, has_api(frame));
    let sorted = Column::of_sort(frame.sort);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let shown = rows[window.start..window.end].iter().map(|p| {
        let cells = cols.iter().map(|&(c, width)| {
            let cell = Cell::from(c.cell_in(p, width));
            if c == Column::RefusedRate && p.refused_per_s > 0.0 {
                // Refusals stand out: red, or bold without colours.
                cell.style(if ctx.colour {
                    Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
                } else {
                    bold
                })
            } else {
                cell
            }
        });
        let row = Row::new(cells);
        if p.exited {
            row.style(Style::default().add_modifier(Modifier::DIM))
        } else {
            row
        }
    });
    let header = cols.iter().map(|&(c, _)| {
        let cell = Cell::from(c.header());
        if c == sorted {
            cell.style(bold.add_modifier(Modifier::REVERSED))
        } else {
            cell.style(bold)
        }
    });
    let widths = cols.iter().map(|&(_, width)| Constraint::Length(width));
    f.render_widget(
        Table::new(shown, widths)
            .header(Row::new(header))
            .block(Block::default().borders(Borders::TOP).title("Processes")),
        table,
    );
    f.render_widget(
        Paragraph::new(status_line(frame, view, &window, ctx.expire_s, ctx.expired)),
        status,
    );
    page
}

/// The key help, over the middle of the screen.
fn draw_help(f: &mut ratatui::Frame, stepping: bool) {
    let lines = help_lines(stepping);
    let area = f.area();
    let width =
        (lines.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u16 + 4).min(area.width);
    let height = (lines.len() as u16 + 2).min(area.height);
    let x = area.x + (area.width - width) / 2;
    let y = area.y + (area.height - height) / 2;
    let rect = Rect::new(x, y, width, height);
    f.render_widget(Clear, rect);
    f.render_widget(
        Paragraph::new(lines.into_iter().map(Line::raw).collect::<Vec<_>>()).block(
            Block::default()
                .borders(Borders::ALL)
                .title("help (any key closes it)"),
        ),
        rect,
    );
}

/// The GPUs table: the GPU as nvidia-smi numbers it (`?` until the run knows which GPU RM's
/// device instance is; AMD: its KFD `gpu_id`), its UUID, live tasks, GPU share (80 columns
/// wide).
fn draw_gpus(f: &mut ratatui::Frame, frame: &Frame, area: Rect, bold: Style) {
    let rows = frame.gpus.iter().map(|g| {
        Row::new(vec![
            g.gpu.map_or_else(|| "?".into(), |v| v.to_string()),
            g.uuid.clone().unwrap_or_else(|| "?".into()),
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
                Constraint::Length(40),
                Constraint::Length(5),
                Constraint::Length(8),
                Constraint::Length(6),
            ],
        )
        .header(Row::new(["GPU", "UUID", "LIVE", "MAX_LIVE", "SHARE%"]).style(bold))
        .block(Block::default().borders(Borders::TOP).title("GPUs")),
        area,
    );
}
