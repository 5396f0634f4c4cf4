// NVIDIA's implementation of the tile vocabulary (calico/tiles.h): mma.sync base tiles.
#pragma once
#include "calico/tile_ops.cuh"
