// Short explanations of every term the page shows: the glossary at its foot and the tooltips of
// every element marked data-term. Thresholds quoted here are kernelfleet/ofu/bottleneck.py's and
// kernelfleet/fleet/detect.py's (tests/unit/test_dashboard_js.py holds them equal).
"use strict";

const TERMS = {
  ofu: ["OFU", "Overall FLOP Utilization: the share of the GPU's dense tensor peak its tensor pipes delivered, " +
    "tensor-pipe activity × SM clock ÷ the SKU's reference clock, from on-chip counters (no change to the program)."],
  capacity: ["capacity-weighted OFU", "The fleet's achieved tensor FLOP/s over its total dense peak: a busy B200 " +
    "counts for more than a busy L4. The mean OFU weights every GPU alike."],
  flops: ["bf16-equivalent tensor PFLOP/s", "Each GPU's OFU × its dense bf16 datasheet peak, summed over the fleet."],
  gpus: ["GPUs", "Whole GPUs that have an OFU now, of all GPUs seen (MIG instances are counted in their GPU)."],
  tensor: ["tensor", "Tensor-pipe activity: the share of cycles the tensor pipes were busy (NVML GPM)."],
  dram: ["DRAM bw", "DRAM bandwidth used, as a share of the GPU's peak."],
  bottleneck: ["bottleneck", "What limited the GPU in the window, from its counters: one of the classes below."],
  "tensor-bound": ["tensor-bound", "Tensor pipes busy 40 % of cycles or more: the GPU does matrix maths."],
  "memory-bound": ["memory-bound", "DRAM bandwidth at 50 % or more without busy tensor pipes: waiting on memory."],
  "low-occupancy/launch-bound": ["low-occupancy/launch-bound", "Under 60 % of SMs busy or few warps resident: small " +
    "kernels, launch overhead or host stalls."],
  "cuda-core-bound": ["cuda-core-bound", "FP32/FP16/FP64/integer pipes busy 50 % or more: maths off the tensor cores."],
  mixed: ["mixed", "Busy, with no dominant pipe (a training step at 38 % tensor and 40 % DRAM, say)."],
  idle: ["idle", "Under 5 % of SMs busy and no tensor work."],
  unknown: ["unknown", "The counters needed to classify the window are missing (or the GPU is stale)."],
  stale: ["stale", "No fresh window from the GPU (missing from the last windows, or the sampler stopped): " +
    "its figures are not counted, never read as zero."],
  regression: ["regression", "A GPU's or job's OFU fell below 70 % of its own baseline (the median of its earlier " +
    "windows) for 20 windows; a recovery is its return to 90 %."],
  heatmap: ["heatmap", "Each GPU's time-weighted OFU per column of time, from the store's minute (or hour) rollups."],
  below: ["GPU-hours below", "The job's share of its GPUs' time in minutes whose OFU was below the threshold " +
    "(a minute without an OFU is not counted)."],
  dollars: ["spent below it", "Those GPU-hours × each GPU's price per hour: the catalog's lowest listed price " +
    "(kernelfleet catalog; override with --catalog/KERNELFLEET_CATALOG) or the price set here."],
};
