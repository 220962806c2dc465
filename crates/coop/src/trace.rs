//! The World Cup sample (`data/wc98-day6-sample.csv.gz`, described in `data/TRACES.md`)
//! as the simulator needs it: one dense object id per url, each object's size, and the
//! requests in time order.
//!
//! An object's size is the largest body the log shows for its url (a 304 or a partial
//! reply is a request for the same object); urls that never had a body (404s) have size
//! 0. By that rule the sample has 2,730 objects and 54.6 MB of distinct bytes, and the
//! 90 % of requests to the most popular objects touch 6.9 MB.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

/// Requests the reader accepts: the sample has 199,999; the bound keeps a wrong file
/// from exhausting memory.
pub const TRACE_REQUESTS_MAX: usize = 10_000_000;

/// A trace client the load generator does not replay (see [`Trace::clients`]).
pub const NOT_REPLAYED: u32 = u32::MAX;

/// A trace: objects and the requests for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Bytes of each object, by id.
    pub object_bytes: Vec<u32>,
    /// The object each request asks for, in time order.
    pub requests: Vec<u32>,
    /// The trace client (the log's user) of each request, numbered as `farside loadgen`
    /// numbers them: densely, in order of first appearance among the rows it replays;
    /// [`NOT_REPLAYED`] for a row it skips (a field it cannot parse, e.g. a status of
    /// -1). Empty when the trace has no clients (a synthetic stream): then every
    /// request is a session of its own ([`Trace::sessions`]).
    pub clients: Vec<u32>,
}

/// `farside loadgen`'s salt of its World Cup start-row draw (`Trace::seeded`).
const LOADGEN_START_SALT: u64 = 0x57A2_7C0F_F5E7_0000;

/// `(time, client)` of a row `farside loadgen` replays (its `parse_row` and load
/// rules: time, client and status parse as integers, the url starts with `/` and is
/// printable ASCII, the size is `-` or an integer, time never goes back), `None` for a
/// row it skips.
fn loadgen_row(fields: &[&str], last_s: u64) -> Option<(u64, u64)> {
    let time_s = fields[0].parse::<u64>().ok()?;
    let client = fields[1].parse::<u64>().ok()?;
    fields[3].parse::<u16>().ok()?;
    let url = fields[2];
    let url_ok = url.starts_with('/') && url.bytes().all(|b| b.is_ascii_graphic());
    let size_ok = fields[4] == "-" || fields[4].parse::<u64>().is_ok();
    (url_ok && size_ok && time_s >= last_s).then_some((time_s, client))
}

/// The sample shipped in the repository.
pub fn world_cup_sample_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/wc98-day6-sample.csv.gz")
}

impl Trace {
    /// Reads a trace in the sample's format (gzip'd CSV with the header
    /// `timestamp,client_id,url,status,size`).
    pub fn read_world_cup(path: &Path) -> io::Result<Trace> {
        let file = std::fs::File::open(path)?;
        let reader = BufReader::new(flate2::read::GzDecoder::new(file));
        let bad = |line: usize, what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}:{line}: {what}", path.display()),
            )
        };
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut client_ids: HashMap<u64, u32> = HashMap::new();
        let mut last_replayed_s = 0u64;
        let mut trace = Trace {
            object_bytes: Vec::new(),
            requests: Vec::new(),
            clients: Vec::new(),
        };
        for (n, line) in reader.lines().enumerate() {
            let line = line?;
            if n == 0 {
                if !line.starts_with("timestamp,") {
                    return Err(bad(1, "missing header"));
                }
                continue;
            }
            if trace.requests.len() >= TRACE_REQUESTS_MAX {
                return Err(bad(n + 1, "more requests than TRACE_REQUESTS_MAX"));
            }
            let fields: Vec<&str> = line.split(',').collect();
            if fields.len() != 5 {
                return Err(bad(n + 1, "expected 5 fields"));
            }
            let size: u32 = match fields[4] {
                "-" => 0,
                s => s.parse().map_err(|_| bad(n + 1, "bad size"))?,
            };
            let next = ids.len() as u32;
            let id = *ids.entry(fields[2].to_string()).or_insert(next);
            if id == next {
                trace.object_bytes.push(0);
            }
            let slot = &mut trace.object_bytes[id as usize];
            *slot = (*slot).max(size);
            trace.requests.push(id);
            let client = match loadgen_row(&fields, last_replayed_s) {
                Some((time_s, client)) => {
                    last_replayed_s = time_s;
                    let next = client_ids.len() as u32;
                    *client_ids.entry(client).or_insert(next)
                }
                None => NOT_REPLAYED,
            };
            trace.clients.push(client);
        }
        Ok(trace)
    }

    /// The rows `farside loadgen` replays (every row whose client is not
    /// [`NOT_REPLAYED`]; every row when the trace has no clients), in order.
    pub fn replayed_rows(&self) -> Vec<usize> {
        if self.clients.len() != self.requests.len() {
            return (0..self.requests.len()).collect();
        }
        (0..self.requests.len())
            .filter(|&r| self.clients[r] != NOT_REPLAYED)
            .collect()
    }

    /// The sessions of a closed-loop replay, as `farside loadgen` forms them: session
    /// `k` is the rows of trace client `k`, in log order (clients numbered as in
    /// [`Trace::clients`]). Without clients every request is a session of its own.
    pub fn sessions(&self) -> Vec<Vec<u32>> {
        if self.clients.len() != self.requests.len() {
            return (0..self.requests.len() as u32).map(|r| vec![r]).collect();
        }
        let mut sessions: Vec<Vec<u32>> = Vec::new();
        for (row, &c) in self.clients.iter().enumerate() {
            if c == NOT_REPLAYED {
                continue;
            }
            if c as usize >= sessions.len() {
                sessions.resize(c as usize + 1, Vec::new());
            }
            sessions[c as usize].push(row as u32);
        }
        sessions
    }

    /// The row a `farside loadgen` instance run with `--seed seed` starts its World Cup
    /// replay at (its `Trace::seeded`: one SplitMix64 draw, uniform over the rows it
    /// replays), as an index into [`Trace::requests`].
    pub fn loadgen_start_row(&self, seed: u64) -> usize {
        let rows = self.replayed_rows();
        if rows.is_empty() {
            return 0;
        }
        let mut z = (seed ^ LOADGEN_START_SALT).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        rows[(z % rows.len() as u64) as usize]
    }

    /// Bytes of all distinct objects.
    pub fn distinct_bytes(&self) -> u64 {
        self.object_bytes.iter().map(|&b| b as u64).sum()
    }

    /// Bytes of the most popular objects that together receive `fraction` of the requests.
    pub fn working_set_bytes(&self, fraction: f64) -> u64 {
        let mut count = vec![0u64; self.object_bytes.len()];
        for &r in &self.requests {
            count[r as usize] += 1;
        }
        let mut order: Vec<usize> = (0..count.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(count[i]));
        let want = (fraction * self.requests.len() as f64).ceil() as u64;
        let (mut seen, mut bytes) = (0u64, 0u64);
        for i in order {
            if seen >= want {
                break;
            }
            seen += count[i];
            bytes += self.object_bytes[i] as u64;
        }
        bytes
    }

    /// The request stream `clients` closed-loop clients make when client `k` replays
    /// this trace from offset `k * len / clients` (wrapping) and they take turns:
    /// `per_client` rounds of one request from each client. (Not what the lab's clients
    /// do: they replay user sessions, [`Trace::sessions`].)
    pub fn interleaved(&self, clients: usize, per_client: usize) -> Trace {
        let len = self.requests.len();
        if len == 0 || clients == 0 {
            return Trace {
                object_bytes: self.object_bytes.clone(),
                requests: Vec::new(),
                clients: Vec::new(),
            };
        }
        let requests = (0..per_client)
            .flat_map(|round| {
                (0..clients).map(move |k| self.requests[(k * len / clients + round) % len])
            })
            .collect();
        Trace {
            object_bytes: self.object_bytes.clone(),
            requests,
            clients: Vec::new(),
        }
    }

    /// Mean bytes per request.
    pub fn mean_request_bytes(&self) -> f64 {
        let total: u64 = self
            .requests
            .iter()
            .map(|&r| self.object_bytes[r as usize] as u64)
            .sum();
        total as f64 / self.requests.len().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_takes_turns_from_each_clients_offset() {
        let t = Trace {
            object_bytes: vec![1; 8],
            requests: (0..8).collect(),
            clients: Vec::new(),
        };
        assert_eq!(t.interleaved(2, 3).requests, vec![0, 4, 1, 5, 2, 6]);
        assert_eq!(t.interleaved(3, 2).requests, vec![0, 2, 5, 1, 3, 6]);
        assert_eq!(t.interleaved(1, 10).requests[8..], [0, 1]);
    }

    #[test]
    fn the_sample_has_the_documented_shape() {
        let t = Trace::read_world_cup(&world_cup_sample_path()).unwrap();
        assert_eq!(t.requests.len(), 199_999);
        assert_eq!(t.object_bytes.len(), 2730);
        assert_eq!(t.distinct_bytes() / 100_000, 546);
        assert_eq!((t.working_set_bytes(0.9) + 50_000) / 100_000, 69);
        assert_eq!((t.working_set_bytes(0.99) + 50_000) / 100_000, 308);
    }
}
