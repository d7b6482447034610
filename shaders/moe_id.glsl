// The expert indirection of matmul_id (matmul.comp / matmul_cm.comp compiled with MM_ID): push
// constants, binding 2 (the route moe_group writes) and the row maps the tiled GEMMs use. A
// workgroup takes one expert (gl_WorkGroupID.z within the bound part) and one BM-row tile of
// that expert's pairs; tiles past its count return at once (the grid covers the most pairs an
// expert can have, so most workgroups of a prefill chunk exit after three loads: cheap next to
// one tile's K loop). Included by matmul_io.glsl.
layout(push_constant) uniform PushBlock { vki_pc_matmul_id p; };
layout(std430, binding = 2) readonly buffer Route { uint route[]; }; // u32[n_expert + 1 + M]

uint id_first; // first entry of this expert's pairs in the list
uint id_count; // its pairs: the tile's rows
uint id_wbase; // its first weight row in the bound part

// Sets up the expert of this workgroup; false when the tile at m_tile has no pair.
bool mm_id_begin(uint m_tile)
{
    const uint e = p.e0 + gl_WorkGroupID.z;
    id_first = route[e];
    id_count = route[e + 1u] - id_first;
    id_wbase = gl_WorkGroupID.z * p.N;
    return m_tile < id_count;
}

#define MM_ROWS id_count
#define Y_ROW(m) route[p.n_expert + 1u + id_first + (m)]
#define X_ROW(m) (Y_ROW(m) / p.x_div)
#define W_ROW(n) (id_wbase + (n))
