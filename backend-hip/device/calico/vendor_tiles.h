// CDNA's implementation of the tile vocabulary (calico/tiles.h): MFMA base tiles, wave64.
#pragma once
#include "calico/hip_tile.h"
