# attn_warnings(target): the warning set every attn target compiles with.
function(attn_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow)
  if(ATTN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(ATTN_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()
