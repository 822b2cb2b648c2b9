{{! `base`: where output `o`'s row starts in the input. }}
    long long base = p.offset;
    long long rem = o;
#pragma unroll
    for (int d = {{RANK}} - 1; d >= 0; --d) {
      base += (rem % p.shape[d]) * p.strides[d];
      rem /= p.shape[d];
    }
