// Copies x to y and counts threads in a __device__ variable: the atomic's address is a
// global variable, so the kernel must be pinned. nvcc -ptx -arch=sm_90 -O3 count.cu -o ../global_counter_nvcc.ptx
__device__ unsigned int g_counter;

__global__ void count(const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i];
    atomicAdd(&g_counter, 1u);
}
