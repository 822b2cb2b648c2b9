//! A cuDNN operation graph as plain data: tensors (UID, dims, strides, type, virtual or not,
//! by value or not) and operations (matmul, pointwise, reduction, RNG, reshape) over them.
//!
//! Building the graph is separate from materialising it into backend descriptors
//! (`super::backend`), so the SDPA graphs can be checked on machines with no GPU and no cuDNN.

/// Element types a graph tensor can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dt {
    F32,
    F16,
    Bf16,
    I32,
    I64,
    Bool,
}

/// One tensor of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub uid: i64,
    pub name: String,
    pub dims: Vec<i64>,
    pub strides: Vec<i64>,
    pub dtype: Dt,
    /// Lives only inside the fused kernel (no memory).
    pub is_virtual: bool,
    /// A host scalar passed by value in the variant pack.
    pub by_value: bool,
}

/// Pointwise modes used by the attention graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pw {
    Add,
    Sub,
    Mul,
    Div,
    Exp,
    Log,
    Identity,
    CmpGe,
    CmpGt,
    BinarySelect,
    GenIndex { axis: i64 },
}

impl Pw {
    /// Number of inputs (x, then b, then t).
    pub fn inputs(self) -> usize {
        match self {
            Pw::Exp | Pw::Log | Pw::Identity | Pw::GenIndex { .. } => 1,
            Pw::BinarySelect => 3,
            _ => 2,
        }
    }
}

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Red {
    Add,
    Max,
}

/// One operation; tensors are named by UID.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `c = a · b` over the last two dims, batch dims broadcast; f32 accumulation.
    Matmul {
        a: i64,
        b: i64,
        c: i64,
    },
    /// `y = mode(x, b, t)` with `prec` the math precision.
    Pointwise {
        mode: Pw,
        prec: Dt,
        x: i64,
        b: Option<i64>,
        t: Option<i64>,
        y: i64,
    },
    Reduction {
        mode: Red,
        x: i64,
        y: i64,
    },
    /// Bernoulli(keep) draws from Philox(seed, offset).
    Rng {
        keep: f64,
        y: i64,
        seed: i64,
        offset: i64,
    },
    /// Same elements, another dims/strides view (a transpose for the backward matmuls).
    Reshape {
        x: i64,
        y: i64,
    },
}

/// A graph under construction. Virtual UIDs start at [`FIRST_VIRTUAL_UID`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    pub tensors: Vec<TensorDesc>,
    pub ops: Vec<Op>,
    next_virtual: i64,
}

pub const FIRST_VIRTUAL_UID: i64 = 1000;

/// Row-major strides of dims.
pub fn packed(dims: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    strides
}

impl Graph {
    pub fn new() -> Self {
        Self {
            next_virtual: FIRST_VIRTUAL_UID,
            ..Default::default()
        }
    }

    pub fn tensor(&self, uid: i64) -> &TensorDesc {
        self.tensors
            .iter()
            .find(|t| t.uid == uid)
            .unwrap_or_else(|| panic!("cuDNN graph: no tensor with UID {uid}"))
    }

    fn add(&mut self, t: TensorDesc) -> i64 {
        assert!(
            self.tensors.iter().all(|o| o.uid != t.uid),
            "cuDNN graph: UID {} used twice",
            t.uid
        );
        let uid = t.uid;
        self.tensors.push(t);
        uid
    }

    /// A tensor with memory (an input or output of the graph) under a fixed UID.
    pub fn io(&mut self, uid: i64, name: &str, dims: &[i64], strides: &[i64], dtype: Dt) -> i64 {
        assert!(uid < FIRST_VIRTUAL_UID);
        self.add(TensorDesc {
            uid,
            name: name.into(),
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            dtype,
            is_virtual: false,
            by_value: false,
        })
    }

    /// A host f32 scalar passed by value, `[1, 1, 1, 1]`.
    pub fn scalar(&mut self, uid: i64, name: &str) -> i64 {
        assert!(uid < FIRST_VIRTUAL_UID);
        self.add(TensorDesc {
            uid,
            name: name.into(),
            dims: vec![1; 4],
            strides: vec![1; 4],
            dtype: Dt::F32,
            is_virtual: false,
            by_value: true,
        })
    }

    /// A virtual intermediate.
    pub fn virt(&mut self, name: &str, dims: &[i64], strides: &[i64], dtype: Dt) -> i64 {
        let uid = self.next_virtual;
        self.next_virtual += 1;
        self.add(TensorDesc {
            uid,
            name: name.into(),
            dims: dims.to_vec(),
            strides: strides.to_vec(),
            dtype,
            is_virtual: true,
            by_value: false,
        })
    }

    pub fn matmul(&mut self, a: i64, b: i64, c: i64) {
        self.ops.push(Op::Matmul { a, b, c });
    }

    /// Pointwise op into an existing tensor `y`, f32 math.
    pub fn pw_into(&mut self, mode: Pw, x: i64, b: Option<i64>, t: Option<i64>, y: i64) {
        let prec = match mode {
            Pw::CmpGe | Pw::CmpGt => Dt::Bool,
            _ => Dt::F32,
        };
        assert_eq!(
            1 + usize::from(b.is_some()) + usize::from(t.is_some()),
            mode.inputs(),
            "cuDNN graph: wrong input count for {mode:?}"
        );
        self.ops.push(Op::Pointwise {
            mode,
            prec,
            x,
            b,
            t,
            y,
        });
    }

    /// Pointwise op into a new virtual tensor shaped like `x` (f32 unless `dtype`).
    pub fn pw(&mut self, name: &str, mode: Pw, x: i64, b: Option<i64>, dtype: Dt) -> i64 {
        let (dims, strides) = {
            let t = self.tensor(x);
            (t.dims.clone(), t.strides.clone())
        };
        let y = self.virt(name, &dims, &strides, dtype);
        self.pw_into(mode, x, b, None, y);
        y
    }

    pub fn reduce(&mut self, mode: Red, x: i64, y: i64) {
        self.ops.push(Op::Reduction { mode, x, y });
    }

    pub fn rng(&mut self, keep: f64, y: i64, seed: i64, offset: i64) {
        self.ops.push(Op::Rng {
            keep,
            y,
            seed,
            offset,
        });
    }

    pub fn reshape(&mut self, x: i64, y: i64) {
        self.ops.push(Op::Reshape { x, y });
    }

    /// UIDs of tensors with memory or a value (what a variant pack must supply).
    pub fn variant_uids(&self) -> Vec<i64> {
        self.tensors
            .iter()
            .filter(|t| !t.is_virtual)
            .map(|t| t.uid)
            .collect()
    }

    /// Every op's tensors exist, every virtual tensor is written exactly once and read at least
    /// once, every non-virtual non-input is written once, and every op's dims agree (see
    /// [`Graph::check_dims`]): the rules cuDNN's finalisation enforces, checked without cuDNN.
    pub fn validate(&self, inputs: &[i64]) -> Result<(), String> {
        let mut written: std::collections::HashMap<i64, usize> = Default::default();
        let mut read: std::collections::HashSet<i64> = Default::default();
        for op in &self.ops {
            if self.ops_tensors_exist(op) {
                self.check_dims(op)?;
            }
            let (ins, out): (Vec<i64>, i64) = match *op {
                Op::Matmul { a, b, c } => (vec![a, b], c),
                Op::Pointwise { x, b, t, y, .. } => {
                    (std::iter::once(x).chain(b).chain(t).collect(), y)
                }
                Op::Reduction { x, y, .. } => (vec![x], y),
                Op::Rng {
                    y, seed, offset, ..
                } => (vec![seed, offset], y),
                Op::Reshape { x, y } => (vec![x], y),
            };
            for uid in ins.iter().chain(std::iter::once(&out)) {
                if !self.tensors.iter().any(|t| t.uid == *uid) {
                    return Err(format!("op {op:?} names unknown UID {uid}"));
                }
            }
            for uid in ins {
                if !written.contains_key(&uid)
                    && !inputs.contains(&uid)
                    && !self.tensor(uid).by_value
                {
                    return Err(format!("UID {uid} is read before it is written ({op:?})"));
                }
                read.insert(uid);
            }
            *written.entry(out).or_default() += 1;
        }
        for t in &self.tensors {
            let w = written.get(&t.uid).copied().unwrap_or(0);
            if inputs.contains(&t.uid) || t.by_value {
                if w > 0 {
                    return Err(format!("input {} ({}) is written", t.uid, t.name));
                }
            } else if w != 1 {
                return Err(format!("{} ({}) is written {w} times", t.uid, t.name));
            }
            if t.is_virtual && !read.contains(&t.uid) {
                return Err(format!("virtual {} ({}) is never read", t.uid, t.name));
            }
            if t.dims.len() != t.strides.len() {
                return Err(format!(
                    "{} ({}): dims and strides differ in rank",
                    t.uid, t.name
                ));
            }
        }
        Ok(())
    }

    fn ops_tensors_exist(&self, op: &Op) -> bool {
        let uids: Vec<i64> = match *op {
            Op::Matmul { a, b, c } => vec![a, b, c],
            Op::Pointwise { x, b, t, y, .. } => {
                std::iter::once(x).chain(b).chain(t).chain([y]).collect()
            }
            Op::Reduction { x, y, .. } | Op::Reshape { x, y } => vec![x, y],
            Op::Rng {
                y, seed, offset, ..
            } => vec![y, seed, offset],
        };
        uids.iter()
            .all(|uid| self.tensors.iter().any(|t| t.uid == *uid))
    }

    /// The dims an op's operands must have: a matmul `[.., m, k]·[.., k, n] → [.., m, n]` whose
    /// operands' batch dims divide the result's (grouped K/V serve several query heads); a
    /// pointwise op's inputs broadcast to its output (each dim equal or 1); a reduction's
    /// output dims divide its input's (1: reduced; a group count: summed over its heads); a
    /// reshape keeps the element count.
    fn check_dims(&self, op: &Op) -> Result<(), String> {
        let dims = |uid: i64| self.tensor(uid).dims.clone();
        let fail = |why: &str| Err(format!("{op:?}: {why}"));
        match *op {
            Op::Matmul { a, b, c } => {
                let (a, b, c) = (dims(a), dims(b), dims(c));
                let r = c.len();
                if a.len() != r || b.len() != r || r < 2 {
                    return fail("operands of different ranks");
                }
                let inner_ok = a[r - 1] == b[r - 2] && a[r - 2] == c[r - 2] && b[r - 1] == c[r - 1];
                let batch_ok = (0..r - 2)
                    .all(|i| a[i] > 0 && b[i] > 0 && c[i] % a[i] == 0 && c[i] % b[i] == 0);
                if !inner_ok {
                    return fail(&format!("{a:?} · {b:?} is not {c:?}"));
                }
                if !batch_ok {
                    return fail(&format!(
                        "batch dims of {a:?} and {b:?} do not divide {c:?}"
                    ));
                }
            }
            Op::Pointwise { x, b, t, y, .. } => {
                let out = dims(y);
                for input in std::iter::once(x).chain(b).chain(t) {
                    let d = dims(input);
                    let broadcasts =
                        d.len() == out.len() && d.iter().zip(&out).all(|(&i, &o)| i == o || i == 1);
                    if !broadcasts {
                        return fail(&format!("{d:?} does not broadcast to {out:?}"));
                    }
                }
            }
            Op::Reduction { x, y, .. } => {
                let (x, y) = (dims(x), dims(y));
                let divides =
                    x.len() == y.len() && x.iter().zip(&y).all(|(&i, &o)| o > 0 && i % o == 0);
                if !divides {
                    return fail(&format!("{x:?} does not reduce to {y:?}"));
                }
            }
            Op::Reshape { x, y } => {
                let count = |d: Vec<i64>| d.iter().product::<i64>();
                if count(dims(x)) != count(dims(y)) {
                    return fail("reshape changes the element count");
                }
            }
            Op::Rng { .. } => {}
        }
        Ok(())
    }
}
