//! Argument checks of the device collectives that `ferrotron_dist::arguments` does not cover.
//!
//! A wrong count handed to NCCL is worse than on the host transports: NCCL trusts the counts,
//! so mismatched ones read or write the wrong bytes or hang. Each check returns the detail; the
//! communicator adds the operation and the group, as the host transports do.

/// A reduce-scatter along the leading dim splits `rows` evenly over `size` ranks.
pub fn divisible_rows(rows: usize, size: usize) -> Result<(), String> {
    if size == 0 || !rows.is_multiple_of(size) {
        return Err(format!(
            "{rows} rows along the leading dim cannot be split evenly over {size} ranks"
        ));
    }
    Ok(())
}

/// An uneven all-gather: one row count per member, and this rank's is the rows it holds.
pub fn uneven_rows(size: usize, rank: usize, counts: &[usize], own: usize) -> Result<(), String> {
    if counts.len() != size {
        return Err(format!("{} row counts for a group of {size}", counts.len()));
    }
    if counts[rank] != own {
        return Err(format!(
            "rank {rank}'s count says {} rows but it holds {own}",
            counts[rank]
        ));
    }
    Ok(())
}

/// Collectives over tensors need at least one dim to split or gather along.
pub(crate) fn has_leading_dim(shape: &[usize]) -> Result<(), String> {
    if shape.is_empty() {
        return Err("a scalar has no dim to gather or scatter along".to_owned());
    }
    Ok(())
}

/// Every member's send counts (`sent[j][i]`: what rank `j` sends to rank `i`) against what
/// `rank` expects to receive: the counts of an all-to-all must agree pairwise, or NCCL moves the
/// wrong bytes. The first disagreement, worded as the TCP transport words it.
pub fn pairwise_counts(sent: &[Vec<usize>], rank: usize, recv: &[usize]) -> Result<(), String> {
    for (j, row) in sent.iter().enumerate() {
        let (sends, expects) = (row.get(rank).copied().unwrap_or(0), recv[j]);
        if sends != expects {
            return Err(format!(
                "rank {j} sends {sends} elements to rank {rank}, which expects {expects}"
            ));
        }
    }
    Ok(())
}

/// A point-to-point call to oneself can only complete inside one group with its matching call.
pub(crate) fn not_self(peer: usize, rank: usize) -> Result<(), String> {
    if peer == rank {
        return Err(format!(
            "rank {rank} cannot send to or receive from itself outside a grouped send_recv"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_rows_are_checked_before_nccl_sees_them() {
        assert!(divisible_rows(8, 4).is_ok());
        assert_eq!(
            divisible_rows(6, 4).unwrap_err(),
            "6 rows along the leading dim cannot be split evenly over 4 ranks"
        );
        assert!(uneven_rows(3, 1, &[2, 0, 5], 0).is_ok());
        assert_eq!(
            uneven_rows(3, 1, &[2, 0], 0).unwrap_err(),
            "2 row counts for a group of 3"
        );
        assert_eq!(
            uneven_rows(2, 0, &[2, 3], 3).unwrap_err(),
            "rank 0's count says 2 rows but it holds 3"
        );
        assert!(has_leading_dim(&[]).is_err());
        assert!(has_leading_dim(&[0, 3]).is_ok());
        assert!(not_self(1, 0).is_ok());
        assert!(not_self(0, 0).is_err());
    }

    #[test]
    fn all_to_all_counts_must_agree_pairwise() {
        // Rank 1's view: rank 0 sends it 2, rank 1 sends itself 1.
        let sent = vec![vec![1, 2], vec![3, 1]];
        assert!(pairwise_counts(&sent, 1, &[2, 1]).is_ok());
        assert_eq!(
            pairwise_counts(&sent, 1, &[1, 1]).unwrap_err(),
            "rank 0 sends 2 elements to rank 1, which expects 1"
        );
        assert_eq!(
            pairwise_counts(&sent, 0, &[1, 0]).unwrap_err(),
            "rank 1 sends 3 elements to rank 0, which expects 0"
        );
    }
}
