//! What an experiment of the lab is, as the sweep runner and the report shell see it.
//!
//! An experiment is a module of its own: its arguments and set-up ([`Experiment::run`]),
//! the point it measures ([`Experiment::Point`]), how repeats of a point combine, and
//! its part of the outputs (text table, CSV files, figures, HTML section). The sweep
//! runner ([`crate::sweep`]) and the report shell ([`crate::report`]) are generic over
//! this trait and name no experiment; the one list of experiments is
//! [`crate::regenerate_any`], which picks the experiment of a kept run from the
//! `experiment` field of its `summary.json`.
//!
//! Points carry no tag of their own: the `experiment` field of `summary.json` says what
//! every point of the run is, so runs kept before this trait existed load unchanged.

use crate::summary::Summary;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io;

/// A figure of the report: `(file name, caption, svg)`.
pub type Figure = (String, String, String);

/// A point type: one measured configuration of an experiment, as kept in `points.jsonl`
/// (one run) and `summary.json` (the runs combined).
pub trait LabPoint: Serialize + DeserializeOwned + Clone + std::fmt::Debug {
    /// What a run keeps beside its point in `points.jsonl` (per-second series, request
    /// samples, ...): the fields of this type are keys of the record, next to `point`.
    /// `NoExtra` for points that keep nothing more.
    type Extra: Serialize + DeserializeOwned + Clone + std::fmt::Debug + PartialEq + Default;

    /// Move the extra data out of the point (it is not part of the point's JSON form).
    fn take_extra(&mut self) -> Self::Extra;

    /// Put the extra data back into the point.
    fn put_extra(&mut self, extra: Self::Extra);

    /// Combine repetitions of one point (all runs of one key, in run order).
    fn combine(runs: &[Self]) -> Self;

    /// The point's figures on one line, for progress output.
    fn progress_line(&self) -> String;
}

/// The extra data of a point that keeps none.
#[derive(Serialize, serde::Deserialize, Clone, Debug, PartialEq, Default)]
pub struct NoExtra {}

/// One experiment of the lab.
pub trait Experiment {
    /// The `experiment` field of its `summary.json` (and the `farside lab` subcommand).
    const NAME: &'static str;
    /// Its command-line arguments.
    type Args;
    /// One measured configuration.
    type Point: LabPoint;

    /// Set up the data-center and run the sweep (`farside lab <NAME>`).
    fn run(args: Self::Args) -> io::Result<()>;

    /// The experiment's part of the text table (after the run lines); empty without
    /// points.
    fn table(s: &Summary<Self::Point>) -> String;

    /// The experiment's data files, `(file name, text)` in writing order (CSV files,
    /// `table.txt`, series): written after `summary.json`, before the figures.
    fn files(s: &Summary<Self::Point>) -> io::Result<Vec<(String, String)>>;

    /// The figures, in a fixed order.
    fn figures(s: &Summary<Self::Point>) -> Vec<Figure>;

    /// The experiment's part of `report.html`, between the parameters and the figures.
    fn html(s: &Summary<Self::Point>) -> String;
}
