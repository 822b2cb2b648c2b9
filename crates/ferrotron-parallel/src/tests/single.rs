//! The size-1 group and the context: one rank is the same code with every group of size one.

use burn::tensor::Tensor;
use ferrotron_dist::{CommError, Communicator, ProcessGroups, World};

use super::{B, assert_close, flat, tensor};
use crate::collectives::{
    all_reduce_detached, all_to_all_rows, copy_to_region, gather_from_region,
    gather_from_sequence_region, reduce_from_region, reduce_scatter_to_sequence_region,
    scatter_to_region,
};
use crate::{ParallelContext, ReduceOp, solo};

#[test]
fn solo_collectives_are_copies_with_checked_arguments() {
    let comm = solo();
    assert_eq!((comm.rank(), comm.size(), comm.global_rank()), (0, 1, 0));
    assert_eq!(comm.label().to_string(), "solo[0]");
    let mut buf = [1.0f32, 2.0];
    comm.all_reduce_f32(&mut buf, ReduceOp::Sum).unwrap();
    assert_eq!(buf, [1.0, 2.0]);
    let mut out = [0.0f32; 2];
    comm.all_gather_f32(&[3.0, 4.0], &mut out).unwrap();
    assert_eq!(out, [3.0, 4.0]);
    comm.reduce_scatter_f32(&[5.0, 6.0], &mut out, ReduceOp::Sum)
        .unwrap();
    assert_eq!(out, [5.0, 6.0]);
    assert!(comm.all_gather_f32(&[1.0], &mut out).is_err());
    assert!(comm.broadcast_f32(&mut out, 1).is_err());
    comm.send_f32(&[7.0, 8.0], 0).unwrap();
    comm.send_u64(&[9], 0).unwrap();
    comm.recv_f32(&mut out, 0).unwrap();
    assert_eq!(out, [7.0, 8.0]);
    let mut count = [0u64];
    comm.recv_u64(&mut count, 0).unwrap();
    assert_eq!(count, [9]);
    let err = comm.recv_f32(&mut out, 0).unwrap_err();
    assert!(err.to_string().contains("no message"), "{err}");
    comm.all_to_all_f32(&[1.0, 2.0], &[2], &mut out, &[2])
        .unwrap();
    assert_eq!(out, [1.0, 2.0]);
    assert!(
        comm.all_to_all_f32(&[1.0, 2.0], &[2], &mut out, &[1])
            .is_err()
    );
    let group = comm.new_group("tp", &[0]).unwrap();
    assert_eq!(group.label().to_string(), "tp[0]");
    assert!(matches!(
        comm.new_group("tp", &[0, 1]),
        Err(CommError::NotAMember { .. })
    ));
    comm.barrier().unwrap();
}

#[test]
fn every_region_op_is_the_identity_on_one_rank_forward_and_backward() {
    let comm = solo();
    let x: Tensor<B, 3> = tensor([2, 4, 3], 0.5).require_grad();
    let c = tensor([2, 4, 3], 0.6);
    let mut y = copy_to_region(x.clone(), &comm);
    y = reduce_from_region(y, &comm);
    y = gather_from_region(y, 1, &comm);
    y = scatter_to_region(y, 2, &comm);
    y = gather_from_sequence_region(y, 0, &comm);
    y = reduce_scatter_to_sequence_region(y, 1, &comm);
    y = all_reduce_detached(y.clone(), ReduceOp::Max, &comm) * 0.0 + y;
    let rows = all_to_all_rows(y.clone().reshape([8, 3]), &[8], &[8], &comm).reshape([2, 4, 3]);
    assert_close(&flat(rows.clone()), &flat(x.clone()), "forward");
    let grads = (rows.powf_scalar(2.0) * c.clone()).sum().backward();
    let expect = flat(x.clone() * c * 2.0);
    assert_close(&flat(x.grad(&grads).unwrap()), &expect, "gradient");
}

#[test]
fn the_single_context_has_every_group_of_size_one() {
    let ctx = ParallelContext::single();
    let sizes = [
        ctx.tp_size(),
        ctx.cp_size(),
        ctx.ep_size(),
        ctx.etp_size(),
        ctx.dp_size(),
        ctx.dp_cp_size(),
        ctx.edp_size(),
        ctx.pp_size(),
    ];
    assert_eq!(sizes, [1; 8]);
    assert!(ctx.is_first_stage() && ctx.is_last_stage() && ctx.embedding.is_some());
    assert!(!ctx.sequence_split());
}

#[test]
fn from_groups_keeps_each_group_and_its_rank() {
    // 4 ranks as tp2 × dp2 (tp fastest), pp1: rank r has tp rank r % 2, dp rank r / 2.
    let contexts = World::new(4)
        .run(|rank_ctx| {
            let world = rank_ctx.world();
            let r = rank_ctx.rank();
            let tp_group = [r - r % 2, r - r % 2 + 1];
            let dp_group = [r % 2, r % 2 + 2];
            let me = [r];
            let groups = ProcessGroups {
                tp: world.new_group("tp", &tp_group)?,
                pp: world.new_group("pp", &me)?,
                dp: world.new_group("dp", &dp_group)?,
                cp: world.new_group("cp", &me)?,
                dp_cp: world.new_group("dp_cp", &dp_group)?,
                ep: world.new_group("ep", &me)?,
                etp: world.new_group("etp", &me)?,
                edp: world.new_group("edp", &dp_group)?,
                embedding: Some(world.new_group("embedding", &me)?),
            };
            let ctx = ParallelContext::from_groups(groups, true);
            let mut probe = [r as f32];
            ctx.tp.all_reduce_f32(&mut probe, ReduceOp::Sum)?;
            Ok::<_, CommError>((
                ctx.global_rank(),
                ctx.tp_rank(),
                ctx.dp_rank(),
                ctx.sequence_split(),
                probe[0],
            ))
        })
        .unwrap_or_else(|err| panic!("{err}"));
    for (r, (global, tp, dp, sp, probe)) in contexts.into_iter().enumerate() {
        assert_eq!((global as usize, tp, dp, sp), (r, r % 2, r / 2, true));
        let first = (r - r % 2) as f32;
        assert_eq!(probe, 2.0 * first + 1.0);
    }
}
