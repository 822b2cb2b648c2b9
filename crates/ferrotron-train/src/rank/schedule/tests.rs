//! The schedules run on a simulated pipeline where a send completes only when the peer posts the
//! matching receive (the strictest, NCCL-like semantics): every layout must finish, every message
//! must be the one the receiver expects, and every chunk must see every microbatch forward then
//! backward exactly once.

use std::collections::HashSet;

use super::*;

/// What travels: an activation leaving piece `piece` or the gradient of piece `piece`'s input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Message {
    grad: bool,
    piece: usize,
    microbatch: usize,
}

enum Endpoint {
    Send { to: usize, message: Message },
    Recv { from: usize, expected: Message },
}

fn endpoint(position: StagePosition, op: &Op) -> Option<Endpoint> {
    match *op {
        Op::Compute(_) => None,
        Op::SendActivation { chunk, microbatch } => Some(Endpoint::Send {
            to: position.next_stage(),
            message: Message {
                grad: false,
                piece: position.piece(chunk),
                microbatch,
            },
        }),
        Op::RecvActivation { chunk, microbatch } => Some(Endpoint::Recv {
            from: position.previous_stage(),
            expected: Message {
                grad: false,
                piece: position.piece(chunk) - 1,
                microbatch,
            },
        }),
        Op::SendGrad { chunk, microbatch } => Some(Endpoint::Send {
            to: position.previous_stage(),
            message: Message {
                grad: true,
                piece: position.piece(chunk),
                microbatch,
            },
        }),
        Op::RecvGrad { chunk, microbatch } => Some(Endpoint::Recv {
            from: position.next_stage(),
            expected: Message {
                grad: true,
                piece: position.piece(chunk) + 1,
                microbatch,
            },
        }),
    }
}

/// Runs every stage's ops with rendezvous sends; `Err` describes a deadlock or a mismatch.
fn simulate(stages: usize, chunks: usize, microbatches: usize) -> Result<(), String> {
    let positions: Vec<StagePosition> = (0..stages)
        .map(|stage| StagePosition {
            stage,
            stages,
            chunks,
        })
        .collect();
    let programs: Vec<Vec<Op>> = positions
        .iter()
        .map(|&p| build(p, microbatches).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut heads = vec![0usize; stages];
    loop {
        if heads.iter().zip(&programs).all(|(h, p)| *h == p.len()) {
            return Ok(());
        }
        let mut progressed = false;
        for rank in 0..stages {
            let Some(op) = programs[rank].get(heads[rank]) else {
                continue;
            };
            match endpoint(positions[rank], op) {
                None => {
                    heads[rank] += 1;
                    progressed = true;
                }
                Some(Endpoint::Send { to, message }) => {
                    let Some(peer_op) = programs[to].get(heads[to]) else {
                        continue;
                    };
                    if let Some(Endpoint::Recv { from, expected }) =
                        endpoint(positions[to], peer_op)
                        && from == rank
                    {
                        if expected != message {
                            return Err(format!(
                                "stage {to} expected {expected:?} from {rank}, got {message:?}"
                            ));
                        }
                        heads[rank] += 1;
                        heads[to] += 1;
                        progressed = true;
                    }
                }
                Some(Endpoint::Recv { .. }) => {}
            }
        }
        if !progressed {
            let stuck: Vec<String> = (0..stages)
                .map(|r| format!("stage {r} at {:?}", programs[r].get(heads[r])))
                .collect();
            return Err(format!("deadlock: {}", stuck.join("; ")));
        }
    }
}

#[test]
fn every_layout_completes_under_blocking_sends() {
    for stages in 1..=5 {
        for microbatches in 1..=9 {
            simulate(stages, 1, microbatches)
                .unwrap_or_else(|e| panic!("pp{stages} m{microbatches}: {e}"));
        }
    }
    for stages in 2..=6 {
        for chunks in 2..=3 {
            for microbatches in (stages..=4 * stages).step_by(stages) {
                simulate(stages, chunks, microbatches)
                    .unwrap_or_else(|e| panic!("pp{stages} vpp{chunks} m{microbatches}: {e}"));
            }
        }
    }
}

#[test]
fn every_chunk_runs_every_microbatch_forward_then_backward_once() {
    for (stages, chunks, microbatches) in [(1, 1, 4), (2, 1, 3), (4, 1, 8), (4, 2, 4), (3, 3, 6)] {
        for stage in 0..stages {
            let position = StagePosition {
                stage,
                stages,
                chunks,
            };
            let ops = build(position, microbatches).expect("valid layout");
            let mut forwarded = HashSet::new();
            let mut backwarded = HashSet::new();
            for op in &ops {
                if let Op::Compute(c) = op {
                    let key = (c.chunk, c.microbatch);
                    if c.forward {
                        assert!(forwarded.insert(key), "{key:?} forwarded twice");
                    } else {
                        assert!(forwarded.contains(&key), "{key:?} backward before forward");
                        assert!(backwarded.insert(key), "{key:?} backwarded twice");
                    }
                }
            }
            assert_eq!(forwarded.len(), chunks * microbatches);
            assert_eq!(backwarded.len(), chunks * microbatches);
        }
    }
}

#[test]
fn a_single_stage_never_communicates() {
    let ops = build(
        StagePosition {
            stage: 0,
            stages: 1,
            chunks: 1,
        },
        3,
    )
    .expect("valid");
    assert!(ops.iter().all(|op| matches!(op, Op::Compute(_))));
}

#[test]
fn impossible_layouts_are_refused() {
    let position = StagePosition {
        stage: 0,
        stages: 4,
        chunks: 2,
    };
    let err = build(position, 6).expect_err("not a multiple of the stages");
    assert!(err.to_string().contains("multiple of the pipeline stages"));
    assert!(build(position, 0).is_err());
}
