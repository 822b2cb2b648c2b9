//! Shape, strides and offset of a tensor view, and the pure index arithmetic on them.
//!
//! Views (reshape, permute, slice with steps, flip, expand) only rewrite this struct, so they
//! cost no kernel. Strides are signed: a flip is a negative stride plus an offset to the last
//! element. Everything here is plain integer logic, tested without a GPU.

use crate::error::{CudaError, OpContext, Result};

/// Largest rank a kernel accepts (index math is unrolled over a fixed-size array).
pub const MAX_RANK: usize = 8;

/// One resolved slice along a dimension: the elements of `start..end` taken every `|step|`,
/// walking backwards from the end when `step < 0` (NumPy and burn semantics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceArg {
    pub start: usize,
    pub end: usize,
    pub step: isize,
}

impl SliceArg {
    /// The whole dimension of size `size`, forwards.
    pub fn full(size: usize) -> Self {
        Self {
            start: 0,
            end: size,
            step: 1,
        }
    }

    pub fn range(start: usize, end: usize) -> Self {
        Self {
            start,
            end,
            step: 1,
        }
    }

    /// Number of elements this slice selects.
    pub fn len(&self) -> usize {
        if self.end <= self.start {
            0
        } else {
            (self.end - self.start).div_ceil(self.step.unsigned_abs())
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Shape, element strides and element offset of a view into a buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: usize,
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (stride, &size) in strides.iter_mut().zip(shape).rev() {
        *stride = acc;
        acc *= size.max(1) as isize;
    }
    strides
}

/// Number of elements of a shape (1 for rank 0).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// NumPy broadcasting of two shapes (aligned at the right).
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

fn dim_from_right(shape: &[usize], from_right: usize) -> usize {
    if from_right < shape.len() {
        shape[shape.len() - 1 - from_right]
    } else {
        1
    }
}

impl Layout {
    /// A fresh row-major layout starting at element 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Row-major with no gaps (the offset may be non-zero). Size-1 dims may have any stride.
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size as isize;
        }
        true
    }

    /// Smallest and one-past-largest element index this view touches (for bounds checks).
    pub fn element_span(&self) -> (isize, isize) {
        if self.numel() == 0 {
            return (self.offset as isize, self.offset as isize);
        }
        let mut lo = self.offset as isize;
        let mut hi = self.offset as isize;
        for (&size, &stride) in self.shape.iter().zip(&self.strides) {
            let reach = (size as isize - 1) * stride;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        (lo, hi + 1)
    }

    /// A view with a new shape of the same element count, when the strides allow one
    /// (PyTorch's rule: each run of merged dims must be contiguous within itself).
    pub fn reshape_view(&self, new_shape: &[usize]) -> Option<Layout> {
        if numel(new_shape) != self.numel() {
            return None;
        }
        if self.is_contiguous() {
            return Some(Layout {
                shape: new_shape.to_vec(),
                strides: contiguous_strides(new_shape),
                offset: self.offset,
            });
        }
        if self.numel() == 0 || new_shape.is_empty() || self.shape.is_empty() {
            return None;
        }
        // PyTorch's `computeStride`: walk old dims from the right in chunks that are contiguous
        // among themselves, and lay the new dims over each chunk.
        let old_shape = &self.shape;
        let old_strides = &self.strides;
        let mut new_strides = vec![0isize; new_shape.len()];
        let mut view_d = new_shape.len() as isize - 1;
        let mut chunk_base_stride = *old_strides.last()?;
        let mut tensor_numel = 1isize;
        let mut view_numel = 1isize;
        for tensor_d in (0..old_shape.len()).rev() {
            tensor_numel *= old_shape[tensor_d] as isize;
            let chunk_ends = tensor_d == 0
                || (old_shape[tensor_d - 1] != 1
                    && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1)
                {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= new_shape[view_d as usize] as isize;
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = old_strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout {
            shape: new_shape.to_vec(),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// Reorders the dims: output dim `i` is input dim `axes[i]`.
    pub fn permute(&self, axes: &[usize]) -> Result<Layout> {
        let ctx = || OpContext::new("permute").shape(&self.shape);
        if axes.len() != self.rank() {
            return Err(CudaError::invalid(
                ctx(),
                format!("{} axes for rank {}", axes.len(), self.rank()),
            ));
        }
        let mut seen = vec![false; axes.len()];
        for &a in axes {
            if a >= axes.len() || seen[a] {
                return Err(CudaError::invalid(
                    ctx(),
                    format!("axes {axes:?} are not a permutation"),
                ));
            }
            seen[a] = true;
        }
        Ok(Layout {
            shape: axes.iter().map(|&a| self.shape[a]).collect(),
            strides: axes.iter().map(|&a| self.strides[a]).collect(),
            offset: self.offset,
        })
    }

    pub fn swap_dims(&self, a: usize, b: usize) -> Result<Layout> {
        let mut axes: Vec<usize> = (0..self.rank()).collect();
        if a >= axes.len() || b >= axes.len() {
            return Err(CudaError::invalid(
                OpContext::new("swap_dims").shape(&self.shape),
                format!("dims {a} and {b} out of range for rank {}", self.rank()),
            ));
        }
        axes.swap(a, b);
        self.permute(&axes)
    }

    /// Broadcast to `shape` (aligned at the right) with zero strides; no copy.
    pub fn expand(&self, shape: &[usize]) -> Result<Layout> {
        let ctx = || OpContext::new("expand").shape(&self.shape).shape(shape);
        if shape.len() < self.rank() {
            return Err(CudaError::invalid(ctx(), "target rank is smaller"));
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0isize; shape.len()];
        for (i, &size) in shape.iter().enumerate() {
            if i < lead {
                continue;
            }
            let src = self.shape[i - lead];
            strides[i] = if src == size {
                self.strides[i - lead]
            } else if src == 1 {
                0
            } else {
                return Err(CudaError::invalid(
                    ctx(),
                    format!("dim {i} of size {src} cannot expand to {size}"),
                ));
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Slices with steps (negative steps walk backwards); missing trailing dims are whole.
    pub fn slice(&self, ranges: &[SliceArg]) -> Result<Layout> {
        let ctx = || OpContext::new("slice").shape(&self.shape);
        if ranges.len() > self.rank() {
            return Err(CudaError::invalid(
                ctx(),
                format!("{} ranges for rank {}", ranges.len(), self.rank()),
            ));
        }
        let mut out = self.clone();
        let mut offset = self.offset as isize;
        for (d, r) in ranges.iter().enumerate() {
            if r.step == 0 {
                return Err(CudaError::invalid(ctx(), format!("step 0 on dim {d}")));
            }
            if r.start > self.shape[d] || r.end > self.shape[d] {
                return Err(CudaError::invalid(
                    ctx(),
                    format!(
                        "range {}..{} out of bounds for dim {d} of size {}",
                        r.start, r.end, self.shape[d]
                    ),
                ));
            }
            let len = r.len();
            let stride = self.strides[d];
            if len > 0 {
                let first = if r.step > 0 {
                    r.start
                } else {
                    // Last selected element walking backwards from end - 1.
                    r.end - 1
                };
                offset += first as isize * stride;
            }
            out.shape[d] = len;
            out.strides[d] = stride * r.step;
        }
        if offset < 0 {
            return Err(CudaError::invalid(ctx(), "slice starts before the buffer"));
        }
        out.offset = offset as usize;
        Ok(out)
    }

    /// Reverses the given dims (negative strides; no copy).
    pub fn flip(&self, axes: &[usize]) -> Result<Layout> {
        let mut ranges: Vec<SliceArg> = self.shape.iter().map(|&s| SliceArg::full(s)).collect();
        for &a in axes {
            if a >= self.rank() {
                return Err(CudaError::invalid(
                    OpContext::new("flip").shape(&self.shape),
                    format!("axis {a} out of range for rank {}", self.rank()),
                ));
            }
            ranges[a].step = -1;
        }
        self.slice(&ranges)
    }

    /// Inserts a size-1 dim at `dim`.
    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut out = self.clone();
        let stride = if dim < self.rank() {
            self.strides[dim] * self.shape[dim] as isize
        } else {
            1
        };
        out.shape.insert(dim, 1);
        out.strides.insert(dim, stride);
        out
    }
}

/// Operand layouts of one element-wise launch, after merging dims that are contiguous in
/// every operand at once. Fewer dims means less index math; one dim means a flat loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coalesced {
    pub shape: Vec<usize>,
    /// `strides[k]` are operand `k`'s strides over `shape`.
    pub strides: Vec<Vec<isize>>,
}

/// Merges adjacent dims that every operand walks contiguously; drops size-1 dims.
/// All layouts must share `shape`. The result has rank >= 1.
pub fn coalesce(shape: &[usize], strides: &[&[isize]]) -> Coalesced {
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<isize>> = vec![Vec::new(); strides.len()];
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        let mergeable = !out_shape.is_empty()
            && strides.iter().zip(&out_strides).all(|(s, o)| {
                let last = *o.last().unwrap_or(&0);
                last == s[d] * shape[d] as isize
            });
        if mergeable {
            let last = out_shape.len() - 1;
            out_shape[last] *= shape[d];
            for (o, s) in out_strides.iter_mut().zip(strides) {
                let l = o.len() - 1;
                o[l] = s[d];
            }
        } else {
            out_shape.push(shape[d]);
            for (o, s) in out_strides.iter_mut().zip(strides) {
                o.push(s[d]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in &mut out_strides {
            o.push(1);
        }
    }
    Coalesced {
        shape: out_shape,
        strides: out_strides,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_are_row_major() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[]), Vec::<isize>::new());
        assert!(Layout::contiguous(&[2, 1, 5]).is_contiguous());
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[3, 1, 5], &[4, 1]), Some(vec![3, 4, 5]));
        assert_eq!(broadcast_shapes(&[], &[2]), Some(vec![2]));
        assert_eq!(broadcast_shapes(&[3], &[4]), None);
    }

    #[test]
    fn permute_then_reshape_needs_copy_but_split_does_not() {
        let base = Layout::contiguous(&[2, 3, 4]);
        let t = base.permute(&[0, 2, 1]).unwrap();
        assert!(!t.is_contiguous());
        assert_eq!(t.reshape_view(&[2, 12]), None);
        // Splitting the last (contiguous in itself) dim of a transposed view is a view.
        let t2 = Layout::contiguous(&[4, 6]).permute(&[1, 0]).unwrap();
        let v = t2.reshape_view(&[6, 2, 2]).unwrap();
        assert_eq!(v.strides, vec![1, 12, 6]);
        // Merging the leading two dims of a sliced layout whose rows stay contiguous.
        let s = Layout::contiguous(&[2, 3, 8])
            .slice(&[SliceArg::full(2), SliceArg::full(3), SliceArg::range(0, 4)])
            .unwrap();
        let m = s.reshape_view(&[6, 4]).unwrap();
        assert_eq!(m.strides, vec![8, 1]);
    }

    #[test]
    fn slices_with_negative_steps_walk_backwards() {
        let l = Layout::contiguous(&[10]);
        let s = l
            .slice(&[SliceArg {
                start: 2,
                end: 8,
                step: -2,
            }])
            .unwrap();
        // Elements 7, 5, 3.
        assert_eq!(
            (s.shape.clone(), s.strides.clone(), s.offset),
            (vec![3], vec![-2], 7)
        );
        assert_eq!(s.element_span(), (3, 8));
    }

    #[test]
    fn flip_and_expand_are_views() {
        let l = Layout::contiguous(&[2, 3]);
        let f = l.flip(&[1]).unwrap();
        assert_eq!((f.strides.clone(), f.offset), (vec![3, -1], 2));
        let e = Layout::contiguous(&[3, 1]).expand(&[2, 3, 4]).unwrap();
        assert_eq!(e.strides, vec![0, 1, 0]);
        assert!(Layout::contiguous(&[3, 2]).expand(&[3, 4]).is_err());
    }

    #[test]
    fn slice_out_of_bounds_is_an_error_not_a_panic() {
        let err = Layout::contiguous(&[4])
            .slice(&[SliceArg::range(1, 9)])
            .unwrap_err();
        assert!(err.to_string().contains("out of bounds"), "{err}");
    }

    #[test]
    fn coalesce_merges_dims_contiguous_in_all_operands() {
        let a = contiguous_strides(&[2, 3, 4]);
        let b = vec![0, 0, 1]; // a broadcast row
        let c = coalesce(&[2, 3, 4], &[&a, &b]);
        assert_eq!(c.shape, vec![6, 4]);
        assert_eq!(c.strides, vec![vec![4, 1], vec![0, 1]]);
        let all = coalesce(&[2, 3, 4], &[&a, &a]);
        assert_eq!(all.shape, vec![24]);
        let scalar = coalesce(&[], &[&[], &[]]);
        assert_eq!(scalar.shape, vec![1]);
    }

    #[test]
    fn unsqueeze_keeps_a_valid_stride() {
        let l = Layout::contiguous(&[2, 3]).unsqueeze(1);
        assert_eq!(
            (l.shape.clone(), l.strides.clone()),
            (vec![2, 1, 3], vec![3, 3, 1])
        );
        assert!(l.is_contiguous());
    }
}
