struct Params {
  long long outer_n;
  long long red_n;
  long long shape[{{RANK}}];
  long long strides[{{RANK}}];
  long long red_stride;
  long long offset;
  unsigned long long in_ptr;
  unsigned long long out_ptr;
  unsigned long long idx_ptr;
  double divisor;
};
