//! NumPy's legacy `RandomState` (MT19937) reduced to what Megatron's index building uses:
//! seeding from an integer and `shuffle` of a 1-D array.
//!
//! Megatron shuffles its document and sample indices with `numpy.random.RandomState(seed)`.
//! Re-implementing that generator (rather than using `rand`) makes the indices reproducible
//! forever, independent of any crate's version, and in practice identical to Megatron's for the
//! same seed: the tests pin outputs produced by NumPy itself.

/// The MT19937 state as NumPy's `RandomState` keeps it.
#[derive(Debug, Clone)]
pub(crate) struct RandomState {
    state: [u32; 624],
    position: usize,
}

impl RandomState {
    /// `numpy.random.RandomState(seed)`. Seeds above 2³² − 1 (which NumPy refuses as integers)
    /// seed from their two 32-bit words, as `RandomState([low, high])` would.
    pub(crate) fn new(seed: u64) -> Self {
        match u32::try_from(seed) {
            Ok(seed) => Self::from_u32(seed),
            Err(_) => Self::from_words(&[seed as u32, (seed >> 32) as u32]),
        }
    }

    fn from_u32(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            state[i] = 1_812_433_253u32
                .wrapping_mul(state[i - 1] ^ (state[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        RandomState {
            state,
            position: 624,
        }
    }

    /// MT19937 `init_by_array`.
    fn from_words(key: &[u32]) -> Self {
        let mut rs = Self::from_u32(19_650_218);
        let mt = &mut rs.state;
        let n = 624usize;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..n.max(key.len()) {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= n {
                mt[0] = mt[n - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..n - 1 {
            mt[i] = (mt[i] ^ (mt[i - 1] ^ (mt[i - 1] >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= n {
                mt[0] = mt[n - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
        rs.position = 624;
        rs
    }

    fn regenerate(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        let mt = &mut self.state;
        for k in 0..624 {
            let y = (mt[k] & UPPER) | (mt[(k + 1) % 624] & LOWER);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ mag;
        }
        self.position = 0;
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        if self.position >= 624 {
            self.regenerate();
        }
        let mut y = self.state[self.position];
        self.position += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    fn next_u64(&mut self) -> u64 {
        let high = u64::from(self.next_u32());
        (high << 32) | u64::from(self.next_u32())
    }

    /// A uniform integer in `0..=max` by masked rejection (NumPy's `random_interval`).
    fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mut mask = max;
        for shift in [1, 2, 4, 8, 16, 32] {
            mask |= mask >> shift;
        }
        loop {
            let value = if max <= u64::from(u32::MAX) {
                u64::from(self.next_u32()) & mask
            } else {
                self.next_u64() & mask
            };
            if value <= max {
                return value;
            }
        }
    }

    /// `RandomState.shuffle` of a 1-D array: Fisher–Yates from the end.
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.interval(i as u64) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_output() {
        // The first outputs of the reference MT19937 seeded with 5489.
        let mut rs = RandomState::new(5489);
        assert_eq!(rs.next_u32(), 3_499_211_612);
        assert_eq!(rs.next_u32(), 581_869_302);
    }

    #[test]
    fn shuffle_matches_numpy() {
        // numpy.random.RandomState(1234).shuffle(numpy.arange(10)) (NumPy 2.4).
        let mut items: Vec<u32> = (0..10).collect();
        RandomState::new(1234).shuffle(&mut items);
        assert_eq!(items, [7, 2, 9, 1, 0, 8, 4, 5, 6, 3]);
    }

    #[test]
    fn one_state_feeds_successive_shuffles_as_in_numpy() {
        let mut rs = RandomState::new(1234);
        let mut first: Vec<u32> = (0..10).collect();
        rs.shuffle(&mut first);
        let mut second: Vec<u32> = (0..1000).collect();
        rs.shuffle(&mut second);
        assert_eq!(
            second[..10],
            [815, 496, 322, 623, 473, 765, 658, 89, 480, 128]
        );
    }

    #[test]
    fn large_seeds_use_init_by_array_like_numpy() {
        // numpy.random.RandomState([123, 1]).shuffle(numpy.arange(20)).
        let mut items: Vec<u32> = (0..20).collect();
        RandomState::new((1 << 32) + 123).shuffle(&mut items);
        assert_eq!(
            items,
            [
                1, 2, 7, 5, 14, 4, 0, 9, 18, 16, 15, 19, 11, 13, 3, 10, 12, 17, 6, 8
            ]
        );
    }
}
