// y = a*x + y. nvcc -ptx -arch=sm_90 -O3 saxpy.cu -o ../saxpy_nvcc.ptx
__global__ void saxpy(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
