// "The last workgroup to finish does the epilogue" without a second dispatch or a barrier
// (matvec.comp's norm and quantising tails, matmul_cm.comp's split-K sum). The including kernel
// declares `coherent buffer ... { uint ncnt[]; }`, the counters, each 0 between dispatches, and
// makes the data the last workgroup will read `coherent` too.
shared bool cnt_last; // this workgroup is the last to count

// Counts this workgroup's n contributions into ncnt[i] (release: its writes first); true,
// uniformly, in the workgroup whose count makes it `total` (acquire: the other workgroups'
// writes), which also sets the counter back to zero for the next dispatch.
bool count_last(uint i, uint n, uint total)
{
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        memoryBarrierBuffer();
        cnt_last = atomicAdd(ncnt[i], n) + n == total;
        memoryBarrierBuffer(); // acquire: the other workgroups' writes
        if (cnt_last)
            ncnt[i] = 0u; // every workgroup has counted: ready for the next dispatch
    }
    barrier();
    if (cnt_last) // uniform
        memoryBarrierBuffer();
    return cnt_last;
}
