//! The argument checks every communicator makes before it talks to anyone.
//!
//! A wrong length or count is the caller's bug, and it must be reported the same way whichever
//! transport runs the collective (threads, TCP, a size-1 group): the same words in the same
//! `CommError::InvalidArgument`, so a test written against one communicator holds for all. Each
//! check returns the detail; the communicator adds the operation and its group.

/// `peer` is a group rank of a group of `size`.
pub fn peer(peer: usize, size: usize) -> Result<(), String> {
    if peer >= size {
        return Err(format!("rank {peer} is outside a group of {size}"));
    }
    Ok(())
}

/// An all-gather's output holds every member's input: `size × input`.
pub fn gathered(size: usize, input: usize, output: usize) -> Result<(), String> {
    if output != size * input {
        return Err(format!(
            "output holds {output} elements, {size} ranks × {input} needed"
        ));
    }
    Ok(())
}

/// A reduce-scatter's input holds one output-sized chunk per member: `size × output`.
pub fn scattered(size: usize, input: usize, output: usize) -> Result<(), String> {
    if input != size * output {
        return Err(format!(
            "input holds {input} elements, {size} ranks × {output} needed"
        ));
    }
    Ok(())
}

/// An all-to-all has one count per member on each side, adding up to its buffer.
pub fn all_to_all(
    size: usize,
    send_counts: &[usize],
    input: usize,
    recv_counts: &[usize],
    output: usize,
) -> Result<(), String> {
    for (what, counts, buffer) in [("send", send_counts, input), ("recv", recv_counts, output)] {
        if counts.len() != size {
            return Err(format!(
                "{} {what} counts for a group of {size}",
                counts.len()
            ));
        }
        let total: usize = counts.iter().sum();
        if total != buffer {
            return Err(format!(
                "{what} counts add up to {total} but the buffer holds {buffer}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_names_what_is_wrong() {
        assert_eq!(peer(2, 2).unwrap_err(), "rank 2 is outside a group of 2");
        assert!(peer(1, 2).is_ok());
        assert_eq!(
            gathered(2, 3, 5).unwrap_err(),
            "output holds 5 elements, 2 ranks × 3 needed"
        );
        assert!(gathered(2, 3, 6).is_ok());
        assert_eq!(
            scattered(2, 5, 3).unwrap_err(),
            "input holds 5 elements, 2 ranks × 3 needed"
        );
        assert!(scattered(2, 6, 3).is_ok());
        assert_eq!(
            all_to_all(2, &[1], 1, &[1, 1], 2).unwrap_err(),
            "1 send counts for a group of 2"
        );
        assert_eq!(
            all_to_all(2, &[1, 1], 2, &[1, 2], 2).unwrap_err(),
            "recv counts add up to 3 but the buffer holds 2"
        );
        assert!(all_to_all(2, &[0, 2], 2, &[1, 0], 1).is_ok());
    }
}
