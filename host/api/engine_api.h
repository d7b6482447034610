/* Inside the project only (hidden, not in vkinfer.h): the GPU engine behind a public vki_engine,
 * for programs that drive steps themselves rather than through a batch manager (the model
 * benchmark, `vkinfer bench-model`). The vki_engine keeps ownership; no batch manager may run
 * on it while the caller steps it. */
#ifndef VKI_HOST_API_ENGINE_API_H
#define VKI_HOST_API_ENGINE_API_H

#include "engine/engine.h"
#include "vkinfer.h"

vk_engine *engine_api_core(vki_engine *e);

#endif
