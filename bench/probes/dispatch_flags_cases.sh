C1='softmax:3x50257:{"block_rows":1,"strategy":"split_cols","block_cols":2048,"num_warps":8,"num_stages":1}'
C2='softmax:3x50257:{"block_rows":1,"strategy":"fori_loop","block_cols":4096,"rows_per_program":1,"num_warps":16,"num_stages":2,"unroll":1}'
C3='layer_norm:4x16384:{"block_rows":1,"strategy":"split_cols","block_cols":2048,"num_warps":4,"num_stages":1}'
C4='layer_norm:4x16384:{"block_cols":8192,"block_rows":2,"fold":"lanes","num_stages":3,"num_warps":32,"rows_per_program":2,"strategy":"fori_loop","unroll":1}'
