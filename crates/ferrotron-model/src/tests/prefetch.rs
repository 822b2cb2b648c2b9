//! The forward runs the waits registered for a layer (`ferrotron_parallel::prefetch`: ZeRO-1's
//! parameter gathers) as that layer starts, in layer order, cut or recomputed or neither, and
//! leaves the waits of layers it does not have for `settle`.

use std::cell::RefCell;
use std::rc::Rc;

use ferrotron_parallel::prefetch;

use super::*;
use crate::RecomputePolicy;

fn layers_waited(model: GptModel<CpuAutodiff>) -> (Vec<usize>, Vec<usize>) {
    let log = Rc::new(RefCell::new(Vec::new()));
    for layer in [5, 1, 0] {
        let log = log.clone();
        prefetch::before_layer_run(layer, Box::new(move || log.borrow_mut().push(layer)));
    }
    let input: &[u32] = &[5, 9, 2, 7, 1, 3, 8, 4];
    let _ = model.loss(tokens(&[input]), tokens(&[input]));
    let _ = ferrotron_parallel::recompute::take::<CpuAutodiff>();
    let during = log.borrow().clone();
    prefetch::settle();
    let after = log.borrow().clone();
    (during, after)
}

#[test]
fn each_layer_runs_its_waits_as_it_starts() {
    for (policy, cut) in [
        (RecomputePolicy::Keep, false),
        (RecomputePolicy::Keep, true),
        (RecomputePolicy::Uniform { layers: 2 }, false),
    ] {
        let model = build::<CpuAutodiff>(&gpt2_model(), 3)
            .with_recompute(policy)
            .with_layer_cuts(cut);
        let (during, after) = layers_waited(model);
        assert_eq!(during, vec![0, 1], "{policy:?}, cut {cut}");
        assert_eq!(after, vec![0, 1, 5], "{policy:?}, cut {cut}");
    }
}
