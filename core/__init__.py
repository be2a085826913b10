"""The shared core of yolov9-trt, below the train, export and serve stages: the model family (modules, the
builder, the zoo YAMLs, checkpoints) and the image operations (decode, letterbox, boxes, NMS, drawing).

Nothing here imports a stage, and this file imports nothing, so the torch-free gateway can use core.image_io."""
