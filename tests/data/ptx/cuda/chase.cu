// Reads through pointers stored in memory: the analysis cannot bound it and must pin it.
// nvcc -ptx -arch=sm_80 -O3 chase.cu -o ../chase_nvcc_sm80.ptx
__global__ void chase(float* const* table, float* out) {
    out[threadIdx.x] = table[threadIdx.x][0];
}
