// A block reduction through shared memory, added into one output word.
// nvcc -ptx -arch=sm_90 -O3 block_sum.cu -o ../block_sum_nvcc.ptx
__global__ void block_sum(const float* in, float* out, int n) {
    __shared__ float part[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    part[threadIdx.x] = i < n ? in[i] : 0.0f;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, part[0]);
}
