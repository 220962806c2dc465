//! Fixed-width text tables: the layout every text table of the lab's reports shares.
//!
//! A [`Table`] is a list of columns (each with a header, an alignment, a minimum width
//! and the text written before it) and rows of already formatted cells. Rendering pads
//! each cell like `format!("{:>w$}")` does (a wider cell is never cut), so a table keeps
//! the exact bytes of the `format!` strings it replaces. Options: a header line of
//! centred group titles spanning several columns ([`Table::group`]), a rule under the
//! header ([`Table::rule`]), trailing blanks trimmed from every line
//! ([`Table::trim_end`]), and text after a row ([`Table::note`]).

/// How a cell is padded to its column's width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// `{:<w}`.
    Left,
    /// `{:>w}`.
    Right,
}

#[derive(Debug, Clone)]
struct Column {
    sep: String,
    head: String,
    align: Align,
    width: usize,
}

#[derive(Debug, Clone)]
struct Row {
    cells: Vec<String>,
    note: String,
}

/// A text table; build it with [`Table::col`], [`Table::row`], then [`Table::render`].
#[derive(Debug, Clone, Default)]
pub struct Table {
    cols: Vec<Column>,
    /// Group titles: (title, the number of columns it spans).
    groups: Vec<(String, usize)>,
    rows: Vec<Row>,
    rule: Option<char>,
    trim: bool,
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A column: `sep` is written before each of its cells (`" "` between columns,
    /// `""` for the first), then the cell padded to `width` as `align` says.
    pub fn col(mut self, sep: &str, head: impl Into<String>, align: Align, width: usize) -> Self {
        self.cols.push(Column {
            sep: sep.to_string(),
            head: head.into(),
            align,
            width,
        });
        self
    }

    /// Columns with the same separator and alignment, one per `(header, width)`.
    pub fn cols<S: Into<String>>(
        mut self,
        sep: &str,
        align: Align,
        heads: impl IntoIterator<Item = (S, usize)>,
    ) -> Self {
        for (head, width) in heads {
            self = self.col(sep, head, align, width);
        }
        self
    }

    /// A group title over the next `span` columns (in the order groups are added),
    /// centred in their width, on a line above the headers.
    pub fn group(mut self, title: impl Into<String>, span: usize) -> Self {
        self.groups.push((title.into(), span));
        self
    }

    /// A line of `c` under the header, as long as the header line.
    pub fn rule(mut self, c: char) -> Self {
        self.rule = Some(c);
        self
    }

    /// Trailing blanks trimmed from every line.
    pub fn trim_end(mut self) -> Self {
        self.trim = true;
        self
    }

    /// A row of formatted cells, one per column (missing cells are blank).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(Row {
            cells,
            note: String::new(),
        });
    }

    /// Text appended to the last row's line.
    pub fn note(&mut self, text: &str) {
        if let Some(r) = self.rows.last_mut() {
            r.note.push_str(text);
        }
    }

    /// One line (no newline) of `cells` laid out in the columns.
    fn line<'a>(&self, cells: impl IntoIterator<Item = &'a str>) -> String {
        let mut out = String::new();
        let mut cells = cells.into_iter();
        for c in &self.cols {
            let cell = cells.next().unwrap_or("");
            out.push_str(&c.sep);
            let w = c.width;
            match c.align {
                Align::Left => out.push_str(&format!("{cell:<w$}")),
                Align::Right => out.push_str(&format!("{cell:>w$}")),
            }
        }
        out
    }

    fn finish(&self, line: String) -> String {
        if self.trim {
            line.trim_end().to_string()
        } else {
            line
        }
    }

    /// The group line, when groups were given.
    fn group_line(&self) -> Option<String> {
        if self.groups.is_empty() {
            return None;
        }
        let mut out = String::new();
        let mut at = 0;
        for (title, span) in &self.groups {
            let cols = &self.cols[at.min(self.cols.len())..(at + span).min(self.cols.len())];
            at += span;
            let Some(first) = cols.first() else { break };
            let w = cols.iter().map(|c| c.width).sum::<usize>()
                + cols[1..]
                    .iter()
                    .map(|c| c.sep.chars().count())
                    .sum::<usize>();
            out.push_str(&first.sep);
            out.push_str(&format!("{title:^w$}"));
        }
        Some(out)
    }

    /// The table: the group line, the header, the rule, the rows; every line ends in
    /// a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(g) = self.group_line() {
            out.push_str(&self.finish(g));
            out.push('\n');
        }
        let head = self.finish(self.line(self.cols.iter().map(|c| c.head.as_str())));
        let rule = self
            .rule
            .map(|c| c.to_string().repeat(head.chars().count()));
        out.push_str(&head);
        out.push('\n');
        if let Some(rule) = rule {
            out.push_str(&rule);
            out.push('\n');
        }
        for r in &self.rows {
            let mut line = self.line(r.cells.iter().map(String::as_str));
            line.push_str(&r.note);
            out.push_str(&self.finish(line));
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_like_format() {
        let mut t = Table::new()
            .col("", "name", Align::Left, 6)
            .col(" ", "n", Align::Right, 4);
        t.row(vec!["a".into(), "12".into()]);
        t.row(vec!["toolong".into(), "12345".into()]);
        t.note("  (x)");
        assert_eq!(
            t.render(),
            format!(
                "{:<6} {:>4}\n{:<6} {:>4}\n{:<6} {:>4}  (x)\n",
                "name", "n", "a", "12", "toolong", "12345"
            )
        );
    }

    #[test]
    fn groups_rule_and_trim() {
        let mut t = Table::new()
            .col("", "x", Align::Right, 3)
            .cols(" | ", Align::Right, [("a", 4)])
            .col("", "b", Align::Right, 3)
            .col(" ", "", Align::Left, 2)
            .group("", 1)
            .group("sys", 2)
            .rule('-')
            .trim_end();
        t.row(vec!["1".into(), "2".into(), "3".into()]);
        assert_eq!(
            t.render(),
            "    |   sys\n  x |    a  b\n-------------\n  1 |    2  3\n"
        );
    }
}
