//! What one attack did and saw, as each target's module reports it.

/// What one attack did and saw.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub succeeded: bool,
    pub effect: String,
    pub packets: u64,
    pub bytes: u64,
    pub answered_bytes: u64,
    /// False when a precondition was missing (nothing captured to replay).
    pub tested: bool,
}

impl Outcome {
    /// An attack that could not be tried, and why.
    pub fn untested(why: &str) -> Outcome {
        Outcome {
            effect: why.to_string(),
            ..Default::default()
        }
    }
}
