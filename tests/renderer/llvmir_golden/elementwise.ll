define void @k(ptr %data0, ptr %data1, i64 %core_start, i64 %core_end) nounwind {
entry:
  %ctr1 = alloca i32
  %v2 = trunc i64 %core_start to i32
  %v3 = trunc i64 %core_end to i32
  store i32 %v2, ptr %ctr1
  br label %cond4
cond4:
  %v7 = load i32, ptr %ctr1
  %v8 = icmp slt i32 %v7, %v3
  br i1 %v8, label %body5, label %exit6
body5:
  %v9 = icmp slt i32 %v7, 6
  br i1 %v9, label %load10, label %join11
load10:
  %v12 = getelementptr inbounds float, ptr %data1, i32 %v7
  %v13 = load float, ptr %v12, align 4
  br label %join11
join11:
  %v14 = phi float [ %v13, %load10 ], [ 0x0000000000000000, %body5 ]
  %v15 = call float @llvm.fma.f32(float %v14, float 0x4000000000000000, float 0x3FF0000000000000)
  %v16 = call float @llvm.sqrt.f32(float %v15)
  %v17 = getelementptr inbounds float, ptr %data0, i32 %v7
  store float %v16, ptr %v17, align 4
  %v18 = add nsw i32 %v7, 1
  store i32 %v18, ptr %ctr1
  br label %cond4
exit6:
  ret void
}
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.sqrt.f32(float)
