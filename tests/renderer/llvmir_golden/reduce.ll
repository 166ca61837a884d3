define void @k(ptr %data0, ptr %data1, i64 %core_start, i64 %core_end) nounwind {
entry:
  %ctr1 = alloca i32
  %acc10 = alloca float
  %ctr11 = alloca i32
  %v2 = trunc i64 %core_start to i32
  %v3 = trunc i64 %core_end to i32
  store i32 %v2, ptr %ctr1
  br label %cond4
cond4:
  %v7 = load i32, ptr %ctr1
  %v8 = icmp slt i32 %v7, %v3
  br i1 %v8, label %body5, label %exit6
body5:
  %v9 = mul nsw i32 %v7, 4
  store float 0x0000000000000000, ptr %acc10
  store i32 0, ptr %ctr11
  br label %cond12
cond12:
  %v15 = load i32, ptr %ctr11
  %v16 = icmp slt i32 %v15, 4
  br i1 %v16, label %body13, label %exit14
body13:
  %v17 = add nsw i32 %v15, %v9
  %v18 = getelementptr inbounds float, ptr %data1, i32 %v17
  %v19 = load float, ptr %v18, align 4
  %v20 = load float, ptr %acc10
  %v21 = fadd reassoc float %v20, %v19
  store float %v21, ptr %acc10
  %v22 = add nsw i32 %v15, 1
  store i32 %v22, ptr %ctr11
  br label %cond12
exit14:
  %v23 = load float, ptr %acc10
  %v24 = getelementptr inbounds float, ptr %data0, i32 %v7
  store float %v23, ptr %v24, align 4
  %v25 = add nsw i32 %v7, 1
  store i32 %v25, ptr %ctr1
  br label %cond4
exit6:
  ret void
}
