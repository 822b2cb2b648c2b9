//! Reuse of a rank's deposit buffers.
//!
//! Every collective copies its contribution into the rendezvous. Allocating those copies afresh
//! makes large collectives page-fault bound (a 64 MiB all-reduce spent most of its time in the
//! kernel zeroing pages), so each communicator keeps its last two deposits and reuses one as soon
//! as every other member has dropped it. At most two buffers per communicator stay alive.

use std::sync::{Arc, Mutex, PoisonError};

use crate::element::Element;
use crate::rendezvous::Payload;

const KEPT: usize = 2;

#[derive(Default)]
pub(crate) struct Recycler {
    spares: Mutex<Vec<Payload>>,
}

impl Recycler {
    /// A `Vec` holding `data`, in a recycled allocation when one is free.
    pub(crate) fn copy_of<T: Element>(&self, data: &[T]) -> Vec<T> {
        let mut spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
        // The smallest free buffer that holds `data`, so that no reuse has to grow (and fault in).
        let free = spares
            .iter()
            .enumerate()
            .filter(|(_, spare)| Arc::strong_count(spare) == 1)
            .filter_map(|(index, spare)| {
                let capacity = spare.downcast_ref::<Vec<T>>()?.capacity();
                (capacity >= data.len()).then_some((capacity, index))
            })
            .min()
            .map(|(_, index)| index);
        let reused = free
            .map(|index| spares.swap_remove(index))
            .and_then(|spare| spare.downcast::<Vec<T>>().ok())
            .and_then(|spare| Arc::try_unwrap(spare).ok());
        match reused {
            Some(mut buffer) => {
                buffer.clear();
                buffer.extend_from_slice(data);
                buffer
            }
            None => data.to_vec(),
        }
    }

    /// Remembers a deposit so that its allocation can be reused once the round is over.
    pub(crate) fn keep(&self, payload: &Payload) {
        let mut spares = self.spares.lock().unwrap_or_else(PoisonError::into_inner);
        if spares.len() == KEPT {
            spares.remove(0);
        }
        spares.push(payload.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_reused_only_once_nobody_else_holds_it() {
        let recycler = Recycler::default();
        let first = recycler.copy_of(&[1.0f32; 1024]);
        let address = first.as_ptr();
        let payload: Payload = Arc::new(first);
        recycler.keep(&payload);
        let held = recycler.copy_of(&[2.0f32; 1024]);
        assert_ne!(held.as_ptr(), address, "still referenced by a reader");
        drop(payload);
        let small: Payload = Arc::new(vec![0.0f32; 8]);
        recycler.keep(&small);
        drop(small);
        let large = recycler.copy_of(&[4.0f32; 512]);
        assert_eq!(
            large.as_ptr(),
            address,
            "the large buffer serves a large copy"
        );
        let reused = recycler.copy_of(&[3.0f32; 8]);
        assert_eq!(reused, vec![3.0; 8]);
        assert!(recycler.copy_of(&[1u32]).len() == 1, "other types allocate");
    }
}
