// RIDGE_HOST_DEVICE marks inline functions that both host code and CUDA device code call
// (layouts shared with GPU kernels: the verbs WQE/CQE layout, the LL line format): under
// nvcc it is `__host__ __device__`, for every other compiler it is empty.
#pragma once

#if defined(__CUDACC__)
#define RIDGE_HOST_DEVICE __host__ __device__
#else
#define RIDGE_HOST_DEVICE
#endif
