#include "vkinfer.h"

vki_sampling_params vki_sampling_default_params(void)
{
    return (vki_sampling_params){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                 .penalty_window = 64};
}
