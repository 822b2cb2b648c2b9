//! Slurm's host-list syntax (`node[01-03,7],gpu-a[1-2]`), expanded into host names.
//!
//! Slurm hands every task its nodes in this compressed form (`SLURM_JOB_NODELIST`), and the
//! first expanded name is where rank 0 runs, i.e. the rendezvous address. The rules follow
//! Slurm's `hostlist.c`: commas outside brackets separate host expressions; inside brackets they
//! separate ranges `lo-hi` or single numbers; a range is zero-padded to the width of its lower
//! bound as written (`[08-10]` gives `08 09 10`, `[8-10]` gives `8 9 10`); several bracket
//! groups in one expression (`rack[1-2]-n[1-2]`) give their cartesian product, first group
//! outermost.

/// Why a host list cannot be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostlistError {
    #[error("host list {list:?}: {detail}")]
    Invalid { list: String, detail: String },
}

/// A list larger than this is surely a typo (`[1-1000000000]`), not a cluster.
const MAX_HOSTS: usize = 1 << 20;

/// Expands a Slurm host list into host names, in order (duplicates kept, as Slurm does).
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, HostlistError> {
    let invalid = |detail: String| HostlistError::Invalid {
        list: list.to_owned(),
        detail,
    };
    let mut hosts = Vec::new();
    for expression in split_top_level(list).map_err(invalid)? {
        let expression = expression.trim();
        if expression.is_empty() {
            continue;
        }
        let pieces = parse_expression(expression).map_err(invalid)?;
        let mut expanded = vec![String::new()];
        for piece in pieces {
            let choices = match piece {
                Piece::Text(text) => vec![text],
                Piece::Ranges(numbers) => numbers,
            };
            if expanded.len().saturating_mul(choices.len()) + hosts.len() > MAX_HOSTS {
                return Err(invalid(format!("expands to more than {MAX_HOSTS} hosts")));
            }
            expanded = expanded
                .iter()
                .flat_map(|prefix| choices.iter().map(move |c| format!("{prefix}{c}")))
                .collect();
        }
        hosts.extend(expanded);
    }
    if hosts.is_empty() {
        return Err(invalid("names no host".to_owned()));
    }
    Ok(hosts)
}

/// Splits at commas that are not inside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut parts) = (0usize, 0, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth > 0 => return Err(format!("nested '[' at byte {i}")),
            '[' => depth += 1,
            ']' if depth == 0 => return Err(format!("']' without '[' at byte {i}")),
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err("a '[' is never closed".to_owned());
    }
    parts.push(&list[start..]);
    Ok(parts)
}

enum Piece {
    Text(String),
    /// The numbers of one bracket group, already formatted with their padding.
    Ranges(Vec<String>),
}

fn parse_expression(expression: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = expression;
    while !rest.is_empty() {
        match rest.find('[') {
            None => {
                pieces.push(Piece::Text(rest.to_owned()));
                break;
            }
            Some(open) => {
                if open > 0 {
                    pieces.push(Piece::Text(rest[..open].to_owned()));
                }
                let close = rest[open..]
                    .find(']')
                    .map(|c| open + c)
                    .ok_or_else(|| format!("a '[' in {expression:?} is never closed"))?;
                pieces.push(Piece::Ranges(parse_ranges(&rest[open + 1..close])?));
                rest = &rest[close + 1..];
            }
        }
    }
    Ok(pieces)
}

/// `01-03,7` → `["01", "02", "03", "7"]`.
fn parse_ranges(inside: &str) -> Result<Vec<String>, String> {
    let mut numbers = Vec::new();
    for range in inside.split(',') {
        let range = range.trim();
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let parse = |text: &str| {
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{range:?} is not a number or a range lo-hi"));
            }
            text.parse::<u64>()
                .map_err(|_| format!("{text:?} is too large"))
        };
        let (start, end) = (parse(lo)?, parse(hi)?);
        if start > end {
            return Err(format!("range {range:?} runs backwards"));
        }
        if end - start >= MAX_HOSTS as u64 {
            return Err(format!("range {range:?} has more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        numbers.extend((start..=end).map(|n| format!("{n:0width$}")));
    }
    Ok(numbers)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn expand(list: &str) -> Vec<String> {
        expand_hostlist(list).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn expands_ranges_padding_and_several_expressions() {
        assert_eq!(
            expand("node[01-03,7],gpu-a[1-2]"),
            ["node01", "node02", "node03", "node7", "gpu-a1", "gpu-a2"]
        );
        assert_eq!(expand("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(expand("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(expand("localhost"), ["localhost"]);
        assert_eq!(expand("a,b[2],c"), ["a", "b2", "c"]);
        assert_eq!(
            expand("rack[1-2]-n[1-2]"),
            ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
        );
        assert_eq!(expand("[3-4]x"), ["3x", "4x"]);
    }

    #[test]
    fn refuses_what_slurm_would_not_write() {
        for (list, detail) in [
            ("node[1-3", "a '[' is never closed"),
            ("node1-3]", "']' without '[' at byte 7"),
            ("n[3-1]", "range \"3-1\" runs backwards"),
            ("n[a-b]", "\"a-b\" is not a number or a range lo-hi"),
            ("n[[1]]", "nested '[' at byte 2"),
            ("", "names no host"),
            (
                "n[1-99999999999]",
                "range \"1-99999999999\" has more than 1048576 hosts",
            ),
        ] {
            assert_eq!(
                expand_hostlist(list).map_err(|e| e.to_string()),
                Err(format!("host list {list:?}: {detail}")),
            );
        }
    }

    /// A random host list written the way Slurm writes them, with its expansion computed
    /// independently (number by number, with `format!` padding).
    fn random_list(rng: &mut StdRng) -> (String, Vec<String>) {
        let prefixes = ["node", "gpu-a", "n", "dgx-h100-", "r1n"];
        let mut parts = Vec::new();
        let mut hosts = Vec::new();
        for _ in 0..rng.random_range(1..4) {
            let prefix = prefixes[rng.random_range(0..prefixes.len())];
            if rng.random_bool(0.2) {
                let n: u32 = rng.random_range(0..500);
                parts.push(format!("{prefix}{n}"));
                hosts.push(format!("{prefix}{n}"));
                continue;
            }
            let width = rng.random_range(1..5usize);
            let limit = 10u64.pow(width as u32);
            let mut ranges = Vec::new();
            for _ in 0..rng.random_range(1..4) {
                let lo = rng.random_range(0..limit);
                let hi = (lo + rng.random_range(0..12)).min(limit - 1);
                let lo_text = format!("{lo:0width$}");
                if lo == hi && rng.random_bool(0.5) {
                    ranges.push(lo_text);
                } else {
                    ranges.push(format!("{lo_text}-{hi:0width$}"));
                }
                hosts.extend((lo..=hi).map(|n| format!("{prefix}{n:0width$}")));
            }
            parts.push(format!("{prefix}[{}]", ranges.join(",")));
        }
        (parts.join(","), hosts)
    }

    #[test]
    fn property_random_lists_expand_to_their_model() {
        let mut rng = StdRng::seed_from_u64(0x5157_524d);
        for case in 0..2000 {
            let (list, hosts) = random_list(&mut rng);
            assert_eq!(expand(&list), hosts, "case {case}: {list}");
        }
    }

    #[test]
    fn property_expansion_is_a_concatenation_over_top_level_commas() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let (a, hosts_a) = random_list(&mut rng);
            let (b, hosts_b) = random_list(&mut rng);
            let joined = expand(&format!("{a},{b}"));
            assert_eq!(joined, [hosts_a, hosts_b].concat());
        }
    }
}
