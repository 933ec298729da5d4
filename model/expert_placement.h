/* Forwards to moe_ep/expert_placement.h, where expert placements are declared. */
#ifndef INA_MODEL_EXPERT_PLACEMENT_H
#define INA_MODEL_EXPERT_PLACEMENT_H

#include "moe_ep/expert_placement.h"

#endif
