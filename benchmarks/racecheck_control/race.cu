// Control for benchmarks/racecheck_probe.py: the same read-after-write race in CUDA C. Warp 0 stores 128
// floats to shared memory, warp 4 reads them back with no __syncthreads() between (--race), or with one.
#include <cstdio>
__global__ void control(float *out, bool race) {
  __shared__ float s[128];
  int t = threadIdx.x;
  if (t < 128) s[t] = 1.0f;
  if (!race) __syncthreads();
  if (t >= 128) out[t - 128] = s[t - 128] + 1.0f;
}
int main(int argc, char **argv) {
  bool race = argc > 1;
  float *out, host[4];
  cudaMalloc(&out, 128 * sizeof(float));
  control<<<1, 256>>>(out, race);
  cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  printf("race=%d: out[:4] = %g %g %g %g\n", race, host[0], host[1], host[2], host[3]);
  return 0;
}
